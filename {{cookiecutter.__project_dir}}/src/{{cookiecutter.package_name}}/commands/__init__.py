"""The project's commands besides training (``cli``): what the ``make`` targets besides ``train`` run, one
file a command, each ``python -m {{ cookiecutter.package_name }}.commands.<name>``."""
