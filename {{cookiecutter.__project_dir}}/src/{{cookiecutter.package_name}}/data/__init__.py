"""LightningDataModules: every data decision (source, split, normalisation) lives here; loaders come from ``engine``."""
{% if cookiecutter.task == "tabular" %}
from .tabular import TabularDataModule

__all__ = ["TabularDataModule"]
{%- else %}
from .digits import DigitsDataModule

__all__ = ["DigitsDataModule"]
{%- endif %}
