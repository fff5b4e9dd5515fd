"""One shrunk config for every test: the real configs/default.yaml, on CPU, written under tmp_path."""

{% if cookiecutter.use_serving == "yes" -%}
import contextlib
import functools
{% endif -%}
import json
import os
import re
{% if cookiecutter.use_serving == "yes" -%}
import resource
{% endif -%}
import signal
import socket
import subprocess
import sys
{% if cookiecutter.use_serving == "yes" -%}
import time
import urllib.error
import urllib.request
{% endif -%}
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

# make test runs one pytest-xdist worker per core: each gets its share of the cores, as do the
# processes its tests start (they inherit OMP_NUM_THREADS), where torch's default of a thread per
# core in every worker would run workers x cores threads on the cores and slow them all.
if (_workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    _share = max(1, (os.cpu_count() or 1) // _workers)
    torch.set_num_threads(_share)
    os.environ["OMP_NUM_THREADS"] = str(_share)


# ---- ports ---------------------------------------------------------------------------------------


def _ports_of_this_worker() -> Iterator[int]:
    # Below the kernel's ephemeral range: a port found free by binding port 0 is one the kernel may hand
    # to another process's socket (a gloo listener of a DDP test running beside this one) before its
    # owner binds it, and a client that then connects to it (a health poll, a TCPStore client) talks to
    # a stranger (the likely cause of a torchrun rank that aborted in CI). Each xdist worker has 400 ports.
    try:
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: macOS's range starts at 49152
        first_ephemeral = 49152
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    start = 20000 + 400 * worker
    if start + 400 > first_ephemeral:
        raise RuntimeError(f"{worker + 1} pytest-xdist workers need ports above {first_ephemeral}, the ephemeral range")
    while True:
        yield from range(start, start + 400)


_PORTS = _ports_of_this_worker()


def free_port() -> int:
    """A loopback port nothing listens on, that the kernel never gives a socket by itself and no other
    pytest-xdist worker takes.

    Raises:
        RuntimeError: the worker's 400 ports are all in use.
    """
    for _, port in zip(range(400), _PORTS, strict=False):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this pytest-xdist worker's block")


@pytest.fixture(autouse=True)
def master_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every DDP run a test starts through Lightning's launcher rendezvouses on a port of :func:`free_port`
    (Lightning otherwise picks one by binding port 0: see ``_ports_of_this_worker``); torchrun picks its own."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))


@contextmanager
def user_error(match: str) -> Iterator[None]:
    """The block must end as a user's mistake does: exit status 2, no traceback, a message matching ``match``.

    The CLI prints ``error: <message>`` and raises SystemExit(2) from the error (engine.errors).
    """
    with pytest.raises(SystemExit) as exit_info:
        yield
    assert exit_info.value.code == 2, f"exit status {exit_info.value.code}, not a user error"
    cause = exit_info.value.__cause__
    assert cause is not None and re.search(match, str(cause)), f"{match!r} not in {cause!r}"


def shrunk_args(tmp_path: Path) -> list[str]:
    """CLI arguments of a quick CPU run of the default config whose every file lands in tmp_path.

    Tests add the subcommand in front and their own overrides after (later arguments win).
    The logger is a CSVLogger so that no test starts a wandb or TensorBoard writer.
    """
    return [
        f"--config={CONFIGS / 'default.yaml'}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=1",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        "--trainer.logger.init_args.name=test",
        "--trainer.enable_model_summary=false",
        "--model.init_args.compile=false",
{%- if cookiecutter.task == "language-model" %}
        # A one-block GPT on 32-byte windows, 10 training batches an epoch: seconds, not minutes.
        "--model.init_args.net.init_args.n_layer=1",
        "--model.init_args.net.init_args.n_head=2",
        "--model.init_args.net.init_args.n_embd=32",
        "--data.init_args.block_size=32",
        "--trainer.limit_train_batches=10",
        "--trainer.limit_val_batches=3",
        "--trainer.limit_test_batches=3",
        "--trainer.log_every_n_steps=5",
        "--trainer.val_check_interval=10",  # validation counts optimizer steps: once per 10-batch epoch
{%- endif %}
    ]

{%- if cookiecutter.task == "tabular" or cookiecutter.use_serving == "yes" or cookiecutter.use_pretrained == "yes" %}


def documentation() -> str:
    """The README and the reference files of docs/, as one text: where the documented commands are."""
    return "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
{%- if cookiecutter.task == "tabular" or (cookiecutter.task == "image-classification" and cookiecutter.use_pretrained == "yes") or (cookiecutter.task == "language-model" and cookiecutter.use_serving == "yes") %}


def readme_commands(section: str) -> list[str]:
    """The commands of the first bash block of the documentation's ``- **<section>**:`` item, comments dropped."""
    text = documentation().split(f"- **{section}**:", 1)[1].split("\n- **", 1)[0]
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]
{%- endif %}
{%- endif %}


{% if cookiecutter.task != "tabular" -%}
def cached_snapshot(cache: Path, repo_id: str, repo_type: str = "model") -> Path:
    """The folder that ``hf download <repo_id> [--repo-type dataset]`` fills in the Hugging Face cache ``cache``
    (``HF_HUB_CACHE``), with the cache's refs/main pointing at it; the caller writes the repository's files into it."""
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


{% endif -%}
{% if cookiecutter.task == "image-classification" and cookiecutter.use_pretrained == "yes" -%}
def colour_folder(root: Path, per_class: int = 30, seed: int = 0) -> Path:
    """root/{red,green,blue}/<n>.png: noisy 40x48 images of one dominant colour each: an easy split."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for channel, name in enumerate(("red", "green", "blue")):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 90, size=(40, 48, 3))
            pixels[..., channel] += 150
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8), mode="RGB").save(root / name / f"{index}.png")
    return root


def assert_fine_tunes_and_ships(
    tmp_path: Path,
    images: Path,
    args: list[str],
{%- if cookiecutter.use_serving == "yes" %}
    onnx: bool = True,
{%- endif %}
) -> tuple[Path, Path, list]:
    """``fit`` with ``args`` on the colour folder ``images`` (:func:`colour_folder`, 30 a class), then check:
{%- if cookiecutter.use_serving == "yes" %}
    test accuracy above chance, ONNX (with ``onnx`` and onnxruntime) and ``.pt2`` files that score the test
    split as PyTorch does, and ``predict`` labelling the blue images blue once the training folder is gone.
{%- else %}
    test accuracy above chance, and ``predict`` labelling the blue images blue once the training folder is
    gone.
{%- endif %}

    Returns the best checkpoint, the folder of the moved blue images and predict's rows.
    """
    import csv
{%- if cookiecutter.use_serving == "yes" %}
    import importlib.util
{%- endif %}
    import shutil

    from {{ cookiecutter.package_name }}.cli import main
    from {{ cookiecutter.package_name }}.commands.predict import predict
{%- if cookiecutter.use_serving == "yes" %}
    from {{ cookiecutter.package_name }}.engine.export import export_all
    from {{ cookiecutter.package_name }}.engine.inference import load_trained
{%- endif %}

    cli = main(["fit", *args])
    accuracy = cli.trainer.callback_metrics["test/acc"].item()
    assert accuracy > 0.6  # three classes: chance is 1/3
    checkpoint = Path(cli.trainer.checkpoint_callback.best_model_path)
{%- if cookiecutter.use_serving == "yes" %}
    onnx = onnx and importlib.util.find_spec("onnxruntime") is not None
    record = export_all(load_trained(checkpoint), tmp_path / "export", onnx=onnx)
    assert len(record["files"]) == 1 + onnx
    for exported in record["files"]:
        assert record["test_scores"][exported]["acc"] == pytest.approx(accuracy)
{%- endif %}
    moved = tmp_path / "moved"
    shutil.copytree(images / "blue", moved)
    shutil.rmtree(images)  # the training images are gone: the checkpoint (and the backbone's files) are enough
    path = predict(ckpt=checkpoint, inputs=str(moved), output=tmp_path / "p.csv", accelerator="cpu")
    with path.open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 30 and sum(row["label"] == "blue" for row in rows) >= 24
    return checkpoint, moved, rows
{%- if cookiecutter.use_serving == "yes" %}


def assert_serves_as_predicted(checkpoint: Path, folder: Path, moved: Path, rows: list) -> None:
    """The server on ``checkpoint`` labels the moved images (base64 in one ``/predict`` request) as ``predict``'s
    ``rows`` did: the same preprocessing, read from the checkpoint in another process."""
    import base64

    files = [moved / row["id"] for row in rows]
    body = json.dumps({"inputs": [base64.b64encode(file.read_bytes()).decode() for file in files]}).encode()
    with serving(checkpoint, folder) as (port, _, _):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body)
        with urllib.request.urlopen(request, timeout=120) as answer:
            labels = json.loads(answer.read())["labels"]
    assert labels == [row["label"] for row in rows]
{%- endif %}


def run_readme_training(tmp_path: Path, command: str, cache: Path) -> dict[str, float]:
    """Run a README ``make train`` command as written, in a copy of the project, offline with the Hugging Face
    cache ``cache``, on :func:`colour_folder` images in place of its ``DIR`` (8 epochs of batches of 16);
    return the test metrics it wrote."""
    import shutil

    project = tmp_path / "project"
    shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns(".venv", "logs", ".git", "wandb", "__pycache__"))
    images = colour_folder(tmp_path / "images", per_class=40)
    short = "--trainer.max_epochs=8 --data.init_args.batch_size=16"  # tiny data: 8 epochs of 6 steps
    command = command.replace("--data.init_args.root=DIR", f"--data.init_args.root={images} {short}")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        ["bash", "-c", f"{command} PYTHON={sys.executable}"], cwd=project, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    (summary,) = (project / "logs").rglob("test_metrics.json")
    return json.loads(summary.read_text())["metrics"]


{% endif -%}
{% if cookiecutter.task == "language-model" and cookiecutter.use_serving != "yes" -%}
def greedy_completions(trained, prompts: list[str]) -> list[str]:
    """Each prompt's greedy continuation from a :func:`engine.inference.load_trained` model, as ``make predict
    INPUTS=prompts.txt`` writes it (the model's ``predict_step``, ending at the end-of-text token)."""
    model, data = trained.model, trained.datamodule
    with torch.no_grad():
        outputs = [model.predict_step((data.prompt_tokens(prompt, "prompt").unsqueeze(0),), 0) for prompt in prompts]
    return [model.describe(output, [])[0]["completion"] for output in outputs]


{% endif -%}
def with_tests_importable() -> dict[str, str]:
    """The environment for a fresh process that may build the tests' own callbacks (``SignalAtStep``), which
    a run's saved config names, so a resumed run builds them again."""
    paths = [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}


def leaves(tree, where: tuple = ()):
    """``(key path, value)`` for every leaf of a loaded checkpoint or JSON tree: what is not a dict, list or tuple."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, (*where, key))
    elif isinstance(tree, list | tuple) and tree:
        for index, value in enumerate(tree):
            yield from leaves(value, (*where, index))
    else:
        yield where, tree


def replaced(tree, where: tuple, value):
    """``tree`` with the leaf at ``where`` replaced by ``value`` (a tuple on the way rebuilt as a tuple)."""
    if not where:
        return value
    key, rest = where[0], where[1:]
    if isinstance(tree, tuple):
        return tuple(replaced(item, rest, value) if index == key else item for index, item in enumerate(tree))
    copy = dict(tree) if isinstance(tree, dict) else list(tree)
    copy[key] = replaced(tree[key], rest, value)
    return copy


def run_hostile_cases(driver: str, cases: list[dict], folder: Path, limit: int, *args: str) -> list[dict]:
    """Run ``driver`` (a script's text, written into ``folder``) in a fresh process on ``cases`` under an
    address-space limit of ``limit`` bytes; the results it prints, one JSON line a case. The driver reads the
    cases file (argv[1]), the limit (argv[2]), then ``args``; ``folder`` is importable (a planted module)."""
    (folder / "cases.json").write_text(json.dumps(cases))
    (folder / "driver.py").write_text(driver)
    env = with_tests_importable()
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env["PYTHONPATH"]])
    command = [sys.executable, str(folder / "driver.py"), str(folder / "cases.json"), str(limit), *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases)
    return results


class StartingWeights(L.Callback):
    """Saves each process's parameters as training starts to ``folder``/rank<N>.pt (a state dict on the CPU)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        state = {key: value.detach().cpu() for key, value in pl_module.state_dict().items()}
        torch.save(state, self.folder / f"rank{trainer.global_rank}.pt")
{%- if cookiecutter.task == "image-classification" %}


class NaNBatchOnRank(L.Callback):
    """Fills the inputs of process ``rank``'s batch at optimizer step ``step`` with NaN (the others' stay finite)."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            batch[0].fill_(float("nan"))
{%- endif %}


def fit_in_subprocess(args: list[str], timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``fit`` with ``args`` in a fresh process, as distributed runs need; fail the test on an error
    (``check=False``: return what it printed and its exit status, whatever they are)."""
    done = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *args],
        cwd=ROOT,
        env=with_tests_importable(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0 or not check, done.stderr[-3000:]
    return done
{%- if cookiecutter.task == "image-classification" and cookiecutter.use_pretrained == "yes" %}


class ReplicaGaps(L.Callback):
    """Under DDP, after each training epoch: the largest difference between the processes' copies of any
    parameter, written by rank 0 to ``path`` as a JSON list (one float an epoch; 0.0 when all agree)."""

    def __init__(self, path: str) -> None:
        self.path, self.gaps = Path(path), []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        flat = torch.cat([parameter.detach().flatten() for parameter in pl_module.parameters()])
        copies = trainer.strategy.all_gather(flat)  # (world size, parameters)
        self.gaps.append((copies - copies[0]).abs().max().item())
        if trainer.is_global_zero:
            self.path.write_text(json.dumps(self.gaps))
{%- endif %}


def fit_stopped_by_signal(args: list[str], step: int, name: str = "SIGTERM", timeout: int = 300) -> Path:
    """Run ``fit`` in a fresh process that gets signal ``name`` after optimizer step ``step`` (on every
    process, as a scheduler's scancel sends it); return the interrupted-step*.ckpt it left. What it printed
    is kept in ``<default_root_dir>/fit.log``."""
    init_args = {"step": step, "name": name}
    signal_at_step = {"class_path": "test_preemption.SignalAtStep", "init_args": init_args}
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *args]
    stopped = subprocess.run(
        [*command, f"--trainer.callbacks+={json.dumps(signal_at_step)}"],
        cwd=ROOT,
        env=with_tests_importable(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert stopped.returncode == 128 + signal.Signals[name], stopped.stderr[-3000:]
    root = Path(next(arg.split("=", 1)[1] for arg in args if arg.startswith("--trainer.default_root_dir=")))
    (root / "fit.log").write_text(stopped.stdout + stopped.stderr)
    (interrupted,) = root.rglob("interrupted-step*.ckpt")
    return interrupted


def resume_as_printed(interrupted: Path) -> list[str]:
    """The ``fit`` arguments an interrupted run prints to continue it: its own config and ``--resume=true`` (a config
    is code: the modules it names, a test's callback, need no ``--trust``)."""
    from {{ cookiecutter.package_name }}.engine.run_records import own_config

    return [f"--config={own_config(interrupted.parent.parent)}", "--resume=true"]


def assert_same_training_state(expected_path: Path, actual_path: Path) -> None:
    """Every tensor of the training state of two checkpoints is equal: weights (and a module's extra
    state), optimizer moments; RNG states are left out (they are per process)."""
    from {{ cookiecutter.package_name }}.engine.checkpoints import read_checkpoint

    expected, actual = (read_checkpoint(path) for path in (expected_path, actual_path))
    assert actual["global_step"] == expected["global_step"]
    assert expected["state_dict"].keys() == actual["state_dict"].keys()
    for key, value in expected["state_dict"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, actual["state_dict"][key]), f"weights differ: {key}"
        else:
            assert value == actual["state_dict"][key], f"state differs: {key}"
    (expected_opt,), (actual_opt,) = expected["optimizer_states"], actual["optimizer_states"]
    assert expected_opt["state"].keys() == actual_opt["state"].keys()
    for index, state in expected_opt["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(actual_opt["state"][index][name])), (index, name)


def assert_run_resumes_exactly(tmp_path: Path, args_for: Callable[[Path], list[str]], step: int) -> Path:
    """In one process: a run of ``args_for(folder)`` stopped by SIGTERM after ``step`` and resumed as it printed
    ends with the training state of an uninterrupted run; returns the interrupted checkpoint.

    For a data set's own reading: the same examples in the same order after a restart. Under DDP every map-style
    data set is split and resumed by the same engine code, run by assert_ddp_run_resumes_exactly."""
    from {{ cookiecutter.package_name }}.cli import main
    from {{ cookiecutter.package_name }}.engine.checkpoints import read_checkpoint

    main(["fit", *args_for(tmp_path / "reference")])
    (reference,) = (tmp_path / "reference").rglob("last.ckpt")
    interrupted = fit_stopped_by_signal(args_for(tmp_path / "stopped"), step=step)
    assert read_checkpoint(interrupted)["global_step"] == step
    main(["fit", *resume_as_printed(interrupted)])
    assert_same_training_state(reference, interrupted.parent / "last.ckpt")
    return interrupted


# Two processes on the CPU (gloo), as the ddp preset runs them on GPUs.
DDP_ON_CPU = [f"--config={CONFIGS / 'presets' / 'ddp.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2"]


def assert_ddp_run_resumes_exactly(tmp_path: Path, args_for: Callable[[Path], list[str]], step: int) -> Path:
    """Under DDP with 2 processes: a run of ``args_for(folder)`` stopped by SIGTERM on both processes
    after ``step`` (as a scheduler's scancel does) and resumed ends with the training state of an
    uninterrupted run; returns the interrupted checkpoint for further checks."""
    from {{ cookiecutter.package_name }}.engine.checkpoints import read_checkpoint

    fit_in_subprocess([*args_for(tmp_path / "reference"), *DDP_ON_CPU])
    (reference,) = (tmp_path / "reference").rglob("last.ckpt")
    args = [*args_for(tmp_path / "stopped"), *DDP_ON_CPU]
    interrupted = fit_stopped_by_signal(args, step=step)
    # Saved a step later than one process alone would: the processes' agreement on a signal is read a
    # step late, so that no step waits for the GPU (callbacks.PreemptionCheckpoint).
    assert read_checkpoint(interrupted)["global_step"] == step + 1
    fit_in_subprocess(resume_as_printed(interrupted))
    assert_same_training_state(reference, interrupted.parent / "last.ckpt")
    return interrupted
{%- if cookiecutter.use_prepared == "yes" %}


def assert_prepared_run_resumes_as_in_memory(
    tmp_path: Path, common: list[str], prepared: Path, source: Path, step: int
) -> None:
    """The prepared path's guarantee, one step off the default: a run of ``common`` arguments on
    ``prepared``, read by two loader workers, stopped by SIGTERM after ``step`` and resumed after its
    ``source`` moved away, ends with the training state of an uninterrupted run in memory."""
    from {{ cookiecutter.package_name }}.cli import main
    from {{ cookiecutter.package_name }}.engine.checkpoints import read_checkpoint

    main(["fit", *shrunk_args(tmp_path / "memory"), *common])
    (reference,) = (tmp_path / "memory").rglob("last.ckpt")
    args = [*shrunk_args(tmp_path / "disk"), *common]
    args += [f"--data.init_args.prepared={prepared}", "--data.init_args.num_workers=2"]
    interrupted = fit_stopped_by_signal(args, step=step)
    assert read_checkpoint(interrupted)["global_step"] == step
    source.rename(source.with_name(source.name + ".moved"))
    main(["fit", *resume_as_printed(interrupted)])
    assert_same_training_state(reference, interrupted.parent / "last.ckpt")
{%- endif %}


@pytest.fixture
def cli_args(tmp_path: Path) -> list[str]:
    """The shrunk arguments for this test's own tmp_path."""
    return shrunk_args(tmp_path)


@pytest.fixture(scope="session", autouse=True)
def _no_pytest_argv():
    # LightningCLI warns when it gets both `args` and command-line arguments (pytest's own).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", sys.argv[:1])
        yield
{%- if cookiecutter.use_serving == "yes" %}


# ---- a server to test against --------------------------------------------------------------------


def as_in_a_terminal(nofile: int | None) -> None:
    """In a server's process before it starts: Ctrl-C's default action, and ``ulimit -n nofile``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if nofile is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


@contextlib.contextmanager
def serving(
    checkpoint: Path,
    folder: Path,
    *args: str,
    env: dict[str, str] | None = None,
    api: str = "predict",
    nofile: int | None = None,
):
    """``python -m <package>.serve --api <api>`` on a free loopback port, in its own process group; stopped
    with SIGTERM. ``nofile``: the server's file-descriptor limit (``ulimit -n``).

    Yields ``(port, process, log file)`` once ``/health`` answers 200.
    """
    port = free_port()
    log_path = folder / f"serve-{port}.log"
    log = log_path.open("w")
    # --timeout: correctness is tested here, on a machine that may be busy with other tests (16
    # generations at once took over 30 s there, the default's 504); latency is measured by serve-bench.
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}.commands.serve", "--ckpt", str(checkpoint)]
    command += ["--port", str(port), f"--api={api}"]
    process = subprocess.Popen(
        [*command, "--timeout=300", *args],
        cwd=folder,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        # As in a terminal, Ctrl-C (SIGINT) interrupts the server: a test started from a background
        # job (a CI script's `&`) would otherwise pass on the job's "ignore SIGINT" to it.
        preexec_fn=functools.partial(as_in_a_terminal, nofile),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            assert time.monotonic() < deadline, "the server did not become healthy in 120 s"
            time.sleep(0.5)
        yield port, process, log_path
    finally:
        with contextlib.suppress(ProcessLookupError):  # the test may have stopped it already
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
            stopped = True
        except subprocess.TimeoutExpired:  # killed, so that no server outlives the test that started it
            stopped = False
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)
        group_gone = time.monotonic() + 30  # the workers and multiprocessing's resource tracker too
        while time.monotonic() < group_gone:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        log.close()
    # Reached only when the test itself passed: a failure of its own is the one to report.
    assert stopped, "the server ignored SIGTERM for 60 s and was killed:\n" + log_path.read_text()[-3000:]
    # Stopped cleanly: nothing left behind for multiprocessing's resource tracker to warn about.
    assert "resource_tracker" not in log_path.read_text(), log_path.read_text()[-3000:]
{%- endif %}
