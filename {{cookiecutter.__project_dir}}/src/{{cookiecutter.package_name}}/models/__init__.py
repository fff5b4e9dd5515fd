"""LightningModules: task logic only (loss, metrics, predictions); the engineering is ``engine.TrainingModule``."""
{% if cookiecutter.task == "tabular" %}
from .tabular import TabularModel

__all__ = ["TabularModel"]
{%- elif cookiecutter.task == "language-model" %}
from .language_model import LanguageModel

__all__ = ["LanguageModel"]
{%- else %}
from .classifier import ImageClassifier

__all__ = ["ImageClassifier"]
{%- endif %}
