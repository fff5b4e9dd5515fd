"""``python -m {{ cookiecutter.package_name }}``: the LightningCLI entry point."""

from .cli import main

if __name__ == "__main__":
    main()
