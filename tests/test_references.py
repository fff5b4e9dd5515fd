"""The general check of a bake's sentences (references.py) finds each kind of false reference, and only those."""

from pathlib import Path

from references import false_references

README = """# Demo

## Train

Run `make train`, then `make evaluate` (no such target), or in a block:

```bash
make train ARGS="--config configs/default.yaml"
make lint
```

Read `configs/default.yaml` and configs/experiments/gone.yaml; the template's `docs/benchmarks.md`,
`docs/bench_x.py` are the template's. `engine.TrainingModule` and `engine.module.TrainingModule.shared_step`
exist, `engine.Missing` and `engine.module.TrainingModule.nothing` do not; `data.batch_size` is a config key.
A run writes best.yaml; transfer-learning.yaml is not in this bake (see "Train"; see "Serve" is not here;
see docs/other.md, "Other" is there).
"""


def demo_project(root: Path) -> Path:
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "default.yaml").write_text("model: {}\n")
    (root / "docs").mkdir()
    (root / "docs" / "other.md").write_text("# Other\n")
    (root / "Makefile").write_text("train: ## train\n\techo train\nlint:\n\techo lint\n")
    engine = root / "src" / "demo" / "engine"
    engine.mkdir(parents=True)
    (root / "src" / "demo" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text('__all__ = ["TrainingModule"]\n')
    (engine / "module.py").write_text("class TrainingModule:\n    def shared_step(self):\n        pass\n")
    (root / "src" / "demo" / "sweep.py").write_text('BEST = "best.yaml"  # what a sweep writes\n')
    (root / "README.md").write_text(README)
    return root


def test_each_kind_of_false_reference_is_found_and_nothing_else(tmp_path: Path) -> None:
    found = false_references(demo_project(tmp_path))
    assert [line.split(" (")[0] for line in found] == [
        "README.md:5: make evaluate",
        "README.md:12: configs/experiments/gone.yaml",
        "README.md:14: engine.Missing",
        "README.md:14: engine.module.TrainingModule.nothing",
        "README.md:15: transfer-learning.yaml",
        'README.md:15: see "Serve"',
    ]
