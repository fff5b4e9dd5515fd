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
Options: --trainer.max_epochs=3 --trainer.max_epoch=3 --model.init_args.lr=0.1 --model.init_args.rate=0.1
--model.init_args.net.init_args.width=8 --model.init_args.net.init_args.depth=2 --data.init_args.root=DIR
--model.init_args.optimizer.init_args.betas=[0.9,0.95] --trainer.logger.init_args.name=x
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
    base = "class ResumableDataModule:\n    def __init__(self, batch_size=32):\n        pass\n"
    (engine / "datamodule.py").write_text(base)
    for folder, source in (
        ("models", "class Classifier(TrainingModule):\n    def __init__(self, net, lr=1e-3, **kwargs):"),
        ("nets", "class MLP:\n    def __init__(self, width: int = 64):"),
        ("data", "class Digits(ResumableDataModule):\n    def __init__(self, root=None, **kwargs):"),
    ):
        (root / "src" / "demo" / folder).mkdir()
        (root / "src" / "demo" / folder / "__init__.py").write_text("")
        (root / "src" / "demo" / folder / "task.py").write_text(source + "\n        pass\n")
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
        "README.md:17: --trainer.max_epoch",
        "README.md:17: --model.init_args.rate",
        "README.md:18: --model.init_args.net.init_args.depth",
    ]
