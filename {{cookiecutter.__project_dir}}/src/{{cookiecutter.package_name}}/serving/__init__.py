"""Serving a trained model over HTTP (LitServe): ``api`` answers ``POST /predict`` for every model, with
the requests it takes and refuses{% if cookiecutter.task == "language-model" %}; ``openai_api`` speaks the OpenAI API (chat completions) for
the language model{% endif %}. ``make serve`` (the ``serve`` command) builds them."""
