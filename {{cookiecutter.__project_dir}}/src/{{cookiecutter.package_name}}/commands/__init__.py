"""The project's commands besides training (``cli``): what ``make predict``, ``export``, ``serve``,
{% if cookiecutter.use_benchmark == 'yes' %}``bench``, {% endif %}{% if cookiecutter.use_sweeps == 'yes' %}``sweep`` {% endif %}and ``prepare`` run{% if cookiecutter.task == "language-model" %}, and ``make generate``{% endif %}, each ``python -m {{ cookiecutter.package_name }}.commands.<name>``."""
