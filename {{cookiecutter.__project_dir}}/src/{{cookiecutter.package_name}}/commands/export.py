"""``make export``: the trained model as files that run without this project, each checked against PyTorch.

    python -m {{ cookiecutter.package_name }}.commands.export                      # best checkpoint of the latest run
    python -m {{ cookiecutter.package_name }}.commands.export --ckpt logs/.../checkpoints/x.ckpt --aoti true --int8 true

Writes into ``<run>/export/`` (or ``--output``): ``model.onnx`` (onnxruntime), ``model.pt2``
(``torch.export``), with ``--aoti`` ``model-aoti.pt2`` (AOTInductor), and ``export.json`` plus
``model-card.md`` (input and output names, shapes, dtypes, classes, checks, scores). The
preprocessing is inside every graph: the input is raw data as a user holds it. See
:mod:`engine.export` for how each file is checked.
"""

import json
from pathlib import Path

from jsonargparse import auto_cli

from {{ cookiecutter.package_name }}.engine import (
    best_checkpoint,
    exit_on_user_error,
    load_trained,
    silence_dependency_noise,
    trusted_modules,
)
from {{ cookiecutter.package_name }}.engine.export import export_all


def export(
    ckpt: Path | None = None,
    output: Path | None = None,
    onnx: bool = True,
    aoti: bool = False,
    int8: bool = False,
    tolerance: float = 1e-4,
    trust: str | None = None,
    inputs: str | None = None,
) -> Path:
    """Export checkpoint ``ckpt``; print the checks and return the folder.

    Args:
        ckpt: the checkpoint; default the best of the latest run under logs/.
        output: the folder; default ``export/`` in the checkpoint's run folder (``<run>/checkpoints/x.ckpt``
            -> ``<run>/export``), or ``<checkpoint name>-export/`` beside a checkpoint kept elsewhere.
        onnx: write model.onnx (needs the ``export`` extra: onnx, onnxscript, onnxruntime).
        aoti: also compile an AOTInductor package (35 to 40 s on 2 CPU cores).
        int8: also score weight-only int8 Linear layers (torchao) on the test split.
        tolerance: largest absolute difference from eager PyTorch that an export may show.
        trust: modules besides this project's package whose classes the checkpoint may name,
            comma-separated (an own DataModule or net kept elsewhere); only for checkpoints you trust.
        inputs: a file or folder of your inputs (as ``make predict`` reads them) to trace and check
            the export on; default the test split, or, when the training data is not at hand,
            random inputs of the checkpoint's shape (see ``engine.export.export_inputs``).

    Raises:
        FileNotFoundError: no checkpoint found or given.
        engine.export.ExportError: an export differs from PyTorch beyond ``tolerance``, or a package is missing.
    """
    path = Path(ckpt) if ckpt is not None else best_checkpoint("logs")
    trained = load_trained(path, trust=trusted_modules(trust))
    folder = Path(output) if output is not None else default_folder(path)
    record = export_all(trained, folder, onnx=onnx, aoti=aoti, int8=int8, tolerance=tolerance, inputs=inputs)
    print(f"checked on {record['checked_on']}")
    for kind, filename in record["files"].items():
        diffs = ", ".join(f"{batch} {value:.2e}" for batch, value in record["max_abs_diff"][kind].items())
        scores = f"; test {json.dumps(record['test_scores'][kind])}" if kind in record["test_scores"] else ""
        print(f"{folder / filename}: max abs diff from PyTorch {diffs}{scores}")
    if "int8" in record["test_scores"]:
        print(
            f"int8 weight-only: test {json.dumps(record['test_scores']['int8'])} "
            f"(float32 {json.dumps(record['test_scores']['eager'])})"
        )
    print(f"{folder / 'export.json'} and model-card.md describe the input, output and checks")
    return folder


def default_folder(checkpoint: Path) -> Path:
    """``<run>/export`` for a checkpoint in ``<run>/checkpoints/``; else ``<name>-export`` beside the checkpoint."""
    if checkpoint.parent.name == "checkpoints":
        return checkpoint.parent.parent / "export"
    return checkpoint.with_name(f"{checkpoint.stem}-export")


def main(args: list[str] | None = None) -> None:
    silence_dependency_noise()
    with exit_on_user_error("export"):  # a missing checkpoint or package, a failed parity check: one line, exit 2
        auto_cli(export, args=args)


if __name__ == "__main__":
    main()
