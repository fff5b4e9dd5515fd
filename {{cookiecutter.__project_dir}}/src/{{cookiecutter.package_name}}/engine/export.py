"""Export a trained :class:`engine.inference.Predictor` and prove each file computes what eager PyTorch does.

- ONNX through the dynamo exporter (``torch.onnx.export(..., dynamo=True)``), one self-contained
  file (``external_data=False``), the batch dimension dynamic (``dynamic_shapes``), run by
  onnxruntime. https://pytorch.org/docs/stable/onnx_dynamo.html
- ``torch.export`` (an ExportedProgram saved as ``.pt2``, ``torch.export.load`` reads it back
  with no project code). https://pytorch.org/docs/stable/export.html
- optionally an AOTInductor package (``torch._inductor.aoti_compile_and_package``): the program
  compiled ahead of time for this machine's CPU or GPU. https://pytorch.org/docs/stable/torch.compiler_aot_inductor.html
- optionally weight-only int8 (torchao ``Int8WeightOnlyConfig``) of the Linear layers, scored
  against float32 on the test split. https://github.com/pytorch/ao
- for a net that writes itself as a Hugging Face model folder (its ``write_hf_folder(path)`` returns a runner
  of the folder reloaded and the model card's lines on loading it), that folder, named hf.

Every file is reloaded right after it is written and run on a batch of 1 and an odd batch; the
largest absolute difference from eager PyTorch is recorded and must stay within ``tolerance``.
The files are written into a partial folder that replaces the export folder only once every
check has passed, so the folder always holds one whole, checked export (or none).
"""

import copy
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .errors import DataError, UserError
from .inference import Trained
from .run_folders import read_test_metrics

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["export_all", "require", "silence_export_noise"]

# Exports (this module, and a pretrained net's adapter library), each the dependency's note to itself:
# torch.onnx's dynamo exporter lists the torchvision operators it skips when torchvision is absent;
# torchao (0.18) logs every optional CUDA/cutlass kernel library it cannot load on this machine;
# torch's _pytree logs that torchao registers an Enum as a pytree constant.
EXPORT_LOGGERS = ("torch.onnx._internal.exporter._registration", "torchao", "torch.utils._pytree")


def silence_export_noise() -> None:
    """Raise the loggers above to ERROR (their warnings describe the dependency, not the user's model)."""
    for name in EXPORT_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


class ExportError(UserError, RuntimeError):
    """An export whose outputs differ from eager PyTorch beyond the tolerance, or a missing export package."""


def require(module: str) -> Any:
    """Import ``module`` of an optional extra, or raise :class:`ExportError` saying how to install it."""
    try:
        return __import__(module)
    except ModuleNotFoundError as error:
        if error.name != module:  # the package is there, but something it imports is not
            raise ExportError(f"{module} does not import here ({error}); reinstall it for this torch") from None
        raise ExportError(
            f"{module} is not installed: `pip install -e '.[export,serve]'` (make install does it)"
        ) from None
    except ImportError as error:  # installed, built for another torch (torchao follows torch releases closely)
        raise ExportError(
            f"{module} does not import beside torch {torch.__version__} ({error}); install a {module} release built "
            "for this torch, or leave out the option that needs it"
        ) from None


def parity_batches(raw: torch.Tensor, dynamic: dict[int, Any], odd: int = 37) -> dict[str, torch.Tensor]:
    """The batches every export is checked on: one sample and an odd count (not a power of two).

    Each other free axis (a sequence length) is also checked cut to an odd, shorter size.
    """
    batches = {"batch_1": raw[:1], f"batch_{min(odd, len(raw))}": raw[:odd]}
    for axis in dynamic:
        if axis > 0 and raw.shape[axis] > 2:
            size = (raw.shape[axis] // 2) | 1
            batches[f"batch_{min(odd, len(raw))}_axis{axis}_{size}"] = raw[:odd].narrow(axis, 0, size)
    return batches


def max_abs_diff(run: Callable[[torch.Tensor], Any], reference: nn.Module, batches: dict[str, torch.Tensor]) -> dict:
    """Largest absolute difference between ``run(batch)`` and ``reference(batch)`` for each named batch."""
    diffs = {}
    with torch.no_grad():
        for name, batch in batches.items():
            expected = reference(batch).float()
            got = torch.as_tensor(np.asarray(run(batch))).float().reshape(expected.shape)
            diffs[name] = float((got - expected).abs().max())
    return diffs


def check_parity(kind: str, diffs: dict[str, float], tolerance: float) -> None:
    """Raise :class:`ExportError` naming the export and the batch when a difference exceeds ``tolerance``."""
    worst = max(diffs, key=diffs.get)
    if not diffs[worst] <= tolerance:  # NaN fails too
        raise ExportError(
            f"{kind}: outputs differ from eager PyTorch by {diffs[worst]:.3g} on {worst} (tolerance {tolerance:g}); "
            "an operator of the net exports differently: compare layer by layer"
        )


# The oldest torch whose dynamo ONNX exporter was seen to work here (2.6 fails inside it, with onnxscript 0.7).
ONNX_MIN_TORCH = (2, 9)


def export_onnx(predictor: nn.Module, example: torch.Tensor, dynamic: dict[int, Any], path: Path) -> Callable:
    """Write ``path`` (one ONNX file, weights inside) and return an onnxruntime runner of it (CPU).

    Raises:
        ExportError: torch older than 2.9, a missing export package, or a model the exporter cannot
            convert (names ``--onnx false``).
    """
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < ONNX_MIN_TORCH:
        raise ExportError(
            f"ONNX export needs torch >= {'.'.join(map(str, ONNX_MIN_TORCH))}, this is torch {torch.__version__}: "
            "upgrade torch, or export model.pt2 alone with --onnx false"
        )
    require("onnxscript")
    onnxruntime = require("onnxruntime")
    try:
        torch.onnx.export(
            predictor,
            (example,),
            str(path),
            dynamo=True,
            external_data=False,
            input_names=["inputs"],
            output_names=["outputs"],
            dynamic_shapes={"inputs": dynamic},
            verbose=False,
        )
    except Exception as error:  # the exporter's own errors (tracing, decomposition, translation) share no base
        # e.g. Swin's window attention: its views fail the exporter's decomposition with a free batch
        # axis, while torch.export of the same model (model.pt2) works.
        cause = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        net = type(getattr(predictor, "net", predictor)).__name__
        raise ExportError(
            f"the ONNX exporter cannot convert {net} ({type(error).__name__}: {cause}); "
            "export model.pt2 alone with --onnx false"
        ) from error
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda batch: session.run(None, {"inputs": batch.numpy()})[0]


def export_program(predictor: nn.Module, example: torch.Tensor, dynamic: dict[int, Any], path: Path):
    """Write ``path`` (``torch.export.save``); return the ExportedProgram and a runner of the reloaded file."""
    program = torch.export.export(predictor, (example,), dynamic_shapes={"inputs": dynamic})
    torch.export.save(program, str(path))
    reloaded = torch.export.load(str(path)).module()
    return program, lambda batch: reloaded(batch).detach()


def export_aoti(program: Any, path: Path) -> Callable:
    """Compile ``program`` ahead of time into the package ``path``; return a runner of the loaded package."""
    package = torch._inductor.aoti_compile_and_package(program, package_path=str(path))
    runner = torch._inductor.aoti_load_package(package)
    return lambda batch: runner(batch).detach()


def quantize_int8(predictor: nn.Module) -> nn.Module:
    """A copy of ``predictor`` with weight-only int8 Linear layers (torchao); the input is not changed."""
    require("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantized = copy.deepcopy(predictor)
    quantize_(quantized, Int8WeightOnlyConfig())
    return quantized


def batched(run: Callable[[torch.Tensor], Any], raw: torch.Tensor, size: int = 256) -> torch.Tensor:
    """``run`` over ``raw`` in batches of ``size``, outputs concatenated (N, ...)."""
    with torch.no_grad():
        parts = [torch.as_tensor(np.asarray(run(raw[i : i + size]))) for i in range(0, len(raw), size)]
    return torch.cat(parts)


# Everything an export folder may hold; a folder with anything else is never replaced.
EXPORT_FILES = frozenset(
    {"model.onnx", "model.pt2", "model-aoti.pt2", "hf", "tokenizer.json", "export.json", "model-card.md"}
)


def export_all(
    trained: Trained,
    folder: Path,
    onnx: bool = True,
    aoti: bool = False,
    int8: bool = False,
    tolerance: float = 1e-4,
    inputs: str | None = None,
) -> dict[str, Any]:
    """Write the exports of ``trained`` into ``folder``, check each, and return what ``export.json`` records.

    The files are traced and checked on the raw inputs :func:`export_inputs` gives for ``inputs``.

    Raises:
        ExportError: an export differs from eager beyond ``tolerance``, a package is missing, or
            ``folder`` holds files that are not an export's.
        DataError: no inputs to check on (see :func:`export_inputs`).
    """
    silence_export_noise()
    folder = folder.resolve()
    if folder.exists() and not folder.is_dir():  # a file (or a link to one) of the user's: never replaced
        raise ExportError(f"--output {folder} is a file, not a folder: export into a new or empty folder (--output)")
    foreign = (
        sorted(entry.name for entry in folder.iterdir() if entry.name not in EXPORT_FILES) if folder.is_dir() else []
    )
    if foreign:  # the folder is replaced whole: never one that holds anything else
        raise ExportError(
            f"{folder} holds files that are not an export ({', '.join(foreign[:5])}); "
            "export into a new or empty folder (--output)"
        )
    partial = folder.with_name(f".{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by an export that was killed
    partial.mkdir(parents=True)
    try:
        record = _export_into(partial, folder, trained, onnx, aoti, int8, tolerance, inputs)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # the previous export, if any, stays as it was
        raise
    replace_folder(partial, folder)
    return record


def replace_folder(new: Path, target: Path) -> None:
    """Put folder ``new`` where ``target`` is, removing the old ``target`` only once ``new`` is in place."""
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def export_inputs(data: Any, inputs: str | None = None, count: int = 64) -> tuple[torch.Tensor, Any, str]:
    """Raw inputs (N, ...) to trace and check an export on, their targets (None when unknown), and their source.

    - ``inputs`` (``make export INPUTS=...``): the user's files, read as ``make predict`` reads them.
    - else the test split, which scores each file too;
    - else, when the training data is not at hand (moved or deleted after training), ``count`` random
      inputs of the shape and value range the checkpoint's DataModule gives (``request_schema``): an
      export of a trained model never needs its training data.

    Raises:
        DataError: the training data is not at hand and the inputs are not arrays the schema
            describes (a table's rows, text): give ``INPUTS=``.
    """
    if inputs is not None:
        _, raw = data.read_inputs(inputs)
        if not isinstance(raw, torch.Tensor):
            raise DataError(f"INPUTS={inputs}: an export is checked on inputs of one shape; leave INPUTS= out")
        return raw, None, f"INPUTS={inputs}"
    try:
        data.setup("test")
        raw, targets = data.raw_inputs("test")
        return raw, targets, "the test split"
    except UserError as error:
        missing = str(error)
    schema = data.request_schema()
    if schema.get("kind") != "array":
        raise DataError(
            f"the training data is not at hand ({missing}): give INPUTS=<your inputs> to check the export on"
        )
    low, high = float(schema.get("min", 0.0)), float(schema.get("max", 1.0))
    raw = low + (high - low) * torch.rand((count, *schema["shape"]), generator=torch.Generator().manual_seed(0))
    shape = schema["shape"]
    return raw, None, f"{count} random inputs of the checkpoint's shape {shape} (the training data is not at hand)"


def _export_into(
    work: Path,
    folder: Path,
    trained: Trained,
    onnx: bool,
    aoti: bool,
    int8: bool,
    tolerance: float,
    inputs: str | None = None,
) -> dict[str, Any]:
    """The body of :func:`export_all`: files into ``work``, messages naming their place in ``folder``."""
    data, predictor = trained.datamodule, trained.predictor.cpu()
    raw, targets, checked_on = export_inputs(data, inputs)
    score = (lambda outputs: trained.model.score(outputs, targets)) if targets is not None else None
    example = raw[:3]  # an odd batch: a batch of 1 would be specialised to a constant
    dynamic = data.dynamic_dims()
    batches = parity_batches(raw, dynamic)
    with torch.no_grad():
        eager = predictor(raw[:1])
    record: dict[str, Any] = {
        "checkpoint": str(trained.checkpoint),
        "input": {"name": "inputs", "shape": _shape(raw, dynamic), "dtype": str(raw.dtype).removeprefix("torch.")},
        "output": {"name": "outputs", "shape": _shape(eager, {0: "batch"}), "dtype": "float32"},
        "input_description": data.raw_description(),
        "output_description": trained.model.output_description(),
        "class_names": trained.class_names,
        **data.inference_metadata(),
        "trained_with": {"model": _class_path(trained.model), "datamodule": _class_path(data)},
        "tolerance": tolerance,
        "checked_on": checked_on,
        "files": {},
        "max_abs_diff": {},
        "test_scores": {"eager": score(batched(predictor, raw))} if score else {},
        "seconds": {},
    }

    def add(kind: str, filename: str, write: Callable[[Path], Any]) -> Any:
        start = time.perf_counter()
        result = write(work / filename)
        runner = result[-1] if isinstance(result, tuple) else result
        record["seconds"][kind] = round(time.perf_counter() - start, 2)
        record["files"][kind] = filename
        record["max_abs_diff"][kind] = max_abs_diff(runner, predictor, batches)
        check_parity(f"{kind} ({folder / filename})", record["max_abs_diff"][kind], tolerance)
        if score:
            record["test_scores"][kind] = score(batched(runner, raw))
        return result

    if onnx:
        add("onnx", "model.onnx", lambda path: export_onnx(predictor, example, dynamic, path))
    program, _ = add("pt2", "model.pt2", lambda path: export_program(predictor, example, dynamic, path))
    if aoti:
        add("aoti", "model-aoti.pt2", lambda path: export_aoti(program, path))
    folder_usage: list[str] = []  # the model card's lines on loading the net's own folder
    if hasattr(trained.model.net, "write_hf_folder"):
        head = trained.model.output_head()

        def write_hf(path: Path) -> tuple[list[str], Callable]:
            """The folder's loading lines, and a runner of ``head(net(batch))`` over the net reloaded from it."""
            net, lines = trained.model.net.write_hf_folder(path)
            return lines, lambda batch: head(net(batch)).detach()

        folder_usage, _ = add("hf", "hf", write_hf)
    if int8:
        quantized = quantize_int8(predictor)
        if score:
            record["test_scores"]["int8"] = score(batched(quantized, raw))
        record["max_abs_diff"]["int8"] = max_abs_diff(quantized, predictor, batches)  # quantisation error, not a bug
    for name, text in data.inference_files().items():  # what building an input needs (a trained tokenizer)
        (work / name).write_text(text, encoding="utf-8")
        record["files"][Path(name).stem] = name
    record["versions"] = versions(work / "model.onnx" if onnx else None)
    record["training_test_metrics"] = (read_test_metrics(trained.checkpoint.parent.parent) or {}).get("metrics")
    (work / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    (work / "model-card.md").write_text(model_card(record, folder_usage))
    return record


def versions(onnx_path: Path | None) -> dict[str, Any]:
    """The torch (and onnxruntime, ONNX opset) an export was made and checked with."""
    found: dict[str, Any] = {"torch": torch.__version__}
    if onnx_path is not None:
        found["onnxruntime"] = require("onnxruntime").__version__
        model = require("onnx").load(str(onnx_path), load_external_data=False)
        found["onnx_opset"] = next(entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx"))
    return found


def _class_path(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _shape(tensor: torch.Tensor, dynamic: dict[int, Any]) -> list[int | str]:
    """The shape with each free axis named: a named ``Dim`` by its name ("batch"), an unnamed one
    (``Dim.DYNAMIC``) by its range ("1 to 128")."""
    names = {axis: _axis_name(dim) for axis, dim in dynamic.items()}
    return [names.get(axis, size) for axis, size in enumerate(tensor.shape)]


def _axis_name(dim: Any) -> str:
    if isinstance(dim, str):
        return dim
    return getattr(dim, "__name__", None) or f"{dim.min} to {dim.max}"


def model_card(record: dict[str, Any], folder_usage: Sequence[str] = ()) -> str:
    """A short Markdown model card of an ``export.json`` record."""
    files = "\n".join(f"- `{name}` ({kind})" for kind, name in record["files"].items())
    diffs = "\n".join(
        f"| {kind} | " + ", ".join(f"{batch}: {value:.2e}" for batch, value in values.items()) + " |"
        for kind, values in record["max_abs_diff"].items()
    )
    scores = "\n".join(
        f"| {kind} | " + ", ".join(f"{name} {value:.4f}" for name, value in values.items()) + " |"
        for kind, values in record["test_scores"].items()
    )
    names = ", ".join(record["class_names"]) or "none"
    source, target = record["input"], record["output"]
    trained_with = record["trained_with"]
    made_with = ", ".join(
        f"{name.replace('onnx_opset', 'ONNX opset')} {version}" for name, version in record["versions"].items()
    )
    return f"""# Model card

Exported from `{record["checkpoint"]}`: the LightningModule `{trained_with["model"]}` trained on the
LightningDataModule `{trained_with["datamodule"]}` (their settings are saved in the checkpoint).
Made and checked with {made_with}.

## Input and output
- input `{source["name"]}`: {source["dtype"]} {source["shape"]}; {record["input_description"]}
- output `{target["name"]}`: {target["dtype"]} {target["shape"]}; {record["output_description"]}
- classes in output order: {names}

## Files
{files}

## Use
{usage(record, folder_usage)}

## Checks (on {record["checked_on"]})
| export | max abs diff from eager PyTorch (tolerance {record["tolerance"]:g}) |
|---|---|
{diffs}

| model | scores on the test split |
|---|---|
{scores}

Test metrics of training: {json.dumps(record["training_test_metrics"])}
"""


def usage(record: dict[str, Any], folder_usage: Sequence[str] = ()) -> str:
    """Code that runs each exported file on ``x``, a NumPy array of the input's shape and dtype."""
    source = record["input"]
    lines = [f"`x`: a NumPy {source['dtype']} array of shape {source['shape']}, as described above.", ""]
    if "onnx" in record["files"]:
        call = 'session.run(None, {"inputs": x})[0]'
        lines += [
            "```python",
            "import onnxruntime  # no torch needed",
            "",
            'session = onnxruntime.InferenceSession("model.onnx")',
        ]
        lines += [f"outputs = {call}", "```", ""]
    lines += [
        "```python",
        "import torch  # no project code needed",
        "",
        'program = torch.export.load("model.pt2").module()',
    ]
    lines += ["outputs = program(torch.as_tensor(x))", "```"]
    if "hf" in record["files"]:
        lines += ["", *folder_usage]
    if "tokenizer" in record["files"]:
        lines += [
            "",
            "`tokenizer.json`: the tokenizer that makes `x` from text (Hugging Face `tokenizers`):",
            "",
            "```python",
            "from tokenizers import Tokenizer",
            "",
            'x = np.array([Tokenizer.from_file("tokenizer.json").encode("Call me").ids])',
            "```",
        ]
    if "aoti" in record["files"]:
        lines += [
            "",
            "`model-aoti.pt2` (compiled for the machine that made it): `torch._inductor.aoti_load_package(path)(x)`.",
        ]
    return "\n".join(lines)
