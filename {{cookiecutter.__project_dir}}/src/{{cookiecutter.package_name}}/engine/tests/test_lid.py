"""The engine's lid: ``engine.__all__`` (and a capability module's own ``__all__``) is the API the project's code
imports, every name of it resolves to a documented class or function, and no name hides behind a module's."""

import importlib
import inspect
import pkgutil

import pytest

engine = importlib.import_module(__package__.rpartition(".")[0])  # this folder's engine, whatever the package's name


def test_every_name_of_the_lid_resolves_to_a_documented_class_or_function() -> None:
    assert len(engine.__all__) == len(set(engine.__all__)) > 30
    for name in engine.__all__:
        found = getattr(engine, name)
        assert inspect.isclass(found) or inspect.isfunction(found), name
        assert inspect.getdoc(found), f"engine.{name} has no docstring"
        assert found.__module__.startswith(f"{engine.__name__}."), name  # the engine's own, not a re-export


def test_no_name_of_the_lid_is_a_module_of_the_engine() -> None:
    # Importing engine/x.py sets the attribute x on the package, which would then hide a lid name x for good.
    modules = {module.name for module in pkgutil.iter_modules(engine.__path__)}
    assert modules & set(engine.__all__) == set()


def test_a_name_outside_the_lid_is_an_attribute_error_that_names_it() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'TrainingModul'"):
        engine.TrainingModul  # noqa: B018 (the lookup is the test)


@pytest.mark.parametrize("module", sorted(module.name for module in pkgutil.iter_modules(engine.__path__)))
def test_a_modules_own_lid_names_what_it_defines(module: str) -> None:
    """A capability's module (a data format's reader, data sets written ahead of training, exports) declares its
    own ``__all__``, each class and function of it documented."""
    try:
        loaded = importlib.import_module(f"{engine.__name__}.{module}")
    except ImportError as missing:  # an optional dependency this environment lacks (an extra not installed)
        pytest.skip(f"engine.{module} needs {missing.name}")
    for name in getattr(loaded, "__all__", []):
        found = getattr(loaded, name)
        if inspect.isclass(found) or inspect.isfunction(found):
            assert inspect.getdoc(found), f"engine.{module}.{name} has no docstring"
