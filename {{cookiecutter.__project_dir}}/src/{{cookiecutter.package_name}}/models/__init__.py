"""LightningModules: task logic only (loss, metrics, predictions); the engineering is ``engine.TrainingModule``."""
{% if cookiecutter.task == "tabular" %}
from .tabular import TabularModel

__all__ = ["TabularModel"]
{%- else %}
from .classifier import ImageClassifier

__all__ = ["ImageClassifier"]
{%- endif %}
