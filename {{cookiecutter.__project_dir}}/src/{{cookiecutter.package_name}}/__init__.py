{{ cookiecutter.description | tojson }}

__version__ = "0.1.0"
