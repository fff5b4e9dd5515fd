"""LightningDataModules: every data decision (source, split, normalisation) lives here; loaders come from ``engine``."""
{% if cookiecutter.task == "tabular" %}
from .tabular import TabularDataModule

__all__ = ["TabularDataModule"]
{%- elif cookiecutter.task == "language-model" %}
from .prompts import PromptCompletionDataModule
from .text import TextDataModule

__all__ = ["PromptCompletionDataModule", "TextDataModule"]
{%- else %}
from .digits import DigitsDataModule
from .image_folder import ImageFolderDataModule

__all__ = ["DigitsDataModule", "ImageFolderDataModule"]
{%- endif %}
