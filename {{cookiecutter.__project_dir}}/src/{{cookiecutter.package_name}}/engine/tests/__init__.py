"""The engine's own tests: task-free (a model and data set of their own), the same files in every bake, so the
engine is tested as the one piece it is. ``make test`` runs them with the project's tests; after changing the
engine, ``python -m pytest src/<package>/engine/tests`` runs them alone, in seconds."""
