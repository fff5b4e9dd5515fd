"""The config system: printing, presets, and bad configs that fail before training."""

import contextlib
import importlib
import io
import json
import logging
import math
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml
from conftest import CONFIGS, ROOT, shrunk_args
from jsonargparse import Namespace
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, RichProgressBar
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from rich.progress import Progress

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.callbacks import (
    ModelSummaryWithoutZeroFlops,
    PreemptionCheckpoint,
    ThrottledRichProgressBar,
)
from {{ cookiecutter.package_name }}.engine.precision import fall_back_to_fp16_without_bf16
from {{ cookiecutter.package_name }}.engine.preflight import wandb_is_configured
from {{ cookiecutter.package_name }}.engine.run_folders import RUN_NAME_VARIABLE, new_run_name, run_dir

PRESETS = sorted(path.stem for path in (CONFIGS / "presets").glob("*.yaml"))


def print_config(capsys: pytest.CaptureFixture, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


def test_print_config_round_trips(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    printed = print_config(capsys, f"--config={CONFIGS / 'default.yaml'}")
    saved = tmp_path / "printed.yaml"
    saved.write_text(printed)
    assert print_config(capsys, f"--config={saved}") == printed
    config = yaml.safe_load(printed)
    assert config["trainer"]["precision"] == "32-true"
    # Linked from the data, so not settable (and not printed) for the model or its net.
{%- if cookiecutter.task == "tabular" %}
    assert not {"task", "num_outputs", "target_scale", "class_names"} & config["model"]["init_args"].keys()
    assert not {"in_features", "out_features"} & config["model"]["init_args"]["net"]["init_args"].keys()
{%- elif cookiecutter.task == "language-model" %}
    assert not {"vocab_size", "block_size"} & config["model"]["init_args"]["net"]["init_args"].keys()
{%- else %}
    assert "num_classes" not in config["model"]["init_args"]
    assert "num_classes" not in config["model"]["init_args"]["net"]["init_args"]
{%- endif %}


def test_the_task_modules_settings_are_declared_once_and_listed_by_its_help(capsys: pytest.CaptureFixture) -> None:
    # The task module passes **kwargs on to engine.TrainingModule: its help, the printed config and the
    # unknown-option hint still name every shared setting.
    model = yaml.safe_load((CONFIGS / "default.yaml").read_text())["model"]["class_path"]
    with pytest.raises(SystemExit):
        main(["fit", f"--config={CONFIGS / 'default.yaml'}", "--model.help", model])
    shown = capsys.readouterr().out
    shared = ("optimizer", "lr_scheduler", "compile", "compile_mode", "channels_last", "init_from")
    assert all(f"--model.{name} " in shown for name in shared), shown
    printed = yaml.safe_load(print_config(capsys, f"--config={CONFIGS / 'default.yaml'}"))["model"]["init_args"]
    assert set(shared) <= printed.keys()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as stderr:
        main(["fit", f"--config={CONFIGS / 'default.yaml'}", "--model.init_args.channel_last=true"])
    assert "did you mean model.init_args.channels_last?" in stderr.getvalue()


# What a default run may print, line by line: our own lines, Lightning's that say something about
# this run, the model summary, the progress bars with their metrics, and the test table.
ALLOWED_LINES = (
    r"Seed set to \d+",
    r"(GPU|TPU|HPU) available: .*",
    r"srun is on this machine's PATH, but this run was not started by it: .*",
    r"Run folder: \S+( \(wandb offline: `wandb sync \S+` uploads it\))?",  # the suffix with wandb only
    r"Columns of .*, (classification|regression)\):",  # a table's columns and how each is used
    r"(numeric, standardised|categorical, one-hot|dropped \(data.drop_columns\)|one value in every).*",
    r"rows (per class )?\(train/val/test\): .*",  # a table's rows in each split, and each class's
    r"Text of .*; tokens train [\d,]+, val [\d,]+, test [\d,]+ .*",  # what a text run read
    r"Images of data\.root=.*|splits: .*|images per class \(train/val/test\): .*",  # what an image-folder run read
    r"[┏┃┡│└].*",  # the model summary's and the test metrics' tables
    r"(Trainable|Non-trainable|Total) params: .*",
    r"Total estimated model params size \(MB\): .*",
    r"Modules in (train|eval) mode: \d+",
    r"(Sanity Checking|Epoch \d+|Validation|Testing)\b.*",  # progress bars
    r"[\w/]+: -?[\d.]+(e-?\d+)?",  # the bar's metrics, one a line
    r"`Trainer.fit` stopped: `max_(epochs|steps)=\d+` reached.",
    r"Plot written to \S+",
    r"Restoring states from the checkpoint path at \S+",
    r"Loaded model weights from the checkpoint at \S+",
    r"Test metrics written to \S+",
)


@pytest.mark.slow
def test_a_default_run_prints_only_lines_a_person_needs(tmp_path: Path) -> None:
    # A fresh process, as `make train` runs, with the project's own logger (wandb logs offline here;
    # a project baked with another logger does not install wandb) and the model summary; its output
    # is not a terminal, so no colour codes either.
    logger = yaml.safe_load((CONFIGS / "trainer.yaml").read_text())["logger"]["class_path"]
    overrides = [
        f"--trainer.logger={logger}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        f"--trainer.logger.init_args.{'project' if logger.endswith('WandbLogger') else 'name'}=test",
        "--trainer.enable_model_summary=true",
    ]
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *shrunk_args(tmp_path), *overrides]
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    env["NETRC"] = str(tmp_path / "no-netrc")  # no credentials: wandb logs offline
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    lines = [line.strip() for line in re.split(r"[\r\n]", output) if line.strip()]
    unexpected = [line for line in lines if not any(re.fullmatch(allowed, line) for allowed in ALLOWED_LINES)]
    assert not unexpected, "\n".join(unexpected)
    assert "\x1b[" not in output  # no colour codes in a file
    (run,) = (tmp_path / "logs" / "test").iterdir()
    assert sum(line.startswith(f"Run folder: {run}") for line in lines) == 1


def test_the_processes_lightning_starts_name_the_run_as_rank_zero_did(monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's DDP launcher runs the same command again for local ranks 1..N-1, with LOCAL_RANK
    # set and rank 0's environment: a name drawn again there (another time, another random part)
    # would give those ranks another run folder for whatever they write per rank.
    for name in (RUN_NAME_VARIABLE, "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    config = Namespace(config=["configs/presets/ddp.yaml"])
    first = new_run_name(config)
    assert re.fullmatch(r"ddp-\d{8}-\d{6}-[0-9a-f]{4}", first)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert new_run_name(config) == first
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc:1")
    assert new_run_name(config) == "ddp-torchrun-abc-1"  # torchrun: every process shares its run id


def test_a_step_limited_run_shows_a_bar_that_ends_at_its_last_step(tmp_path: Path) -> None:
    # Lightning's bar says "Epoch 0/<max_epochs - 1>" and counts to the epoch's end, with its ETA,
    # though max_steps stops the run earlier.
    args = ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--test_after_fit=false"]
    cli = main(["fit", *shrunk_args(tmp_path), *args])
    (bar,) = [callback for callback in cli.trainer.callbacks if isinstance(callback, RichProgressBar)]
    assert cli.trainer.global_step == 3
    assert bar._epoch_stops_at == 3 < cli.trainer.num_training_batches  # the bar counted to step 3 of 10
    assert bar._get_train_description(0) == "Epoch 0 (stops at step 3)"


def test_the_bar_shows_a_short_epochs_speed_where_rich_has_too_few_updates_to_estimate_it() -> None:
    # rich estimates speed from the updates of the last 30 s; a throttled bar may update a short epoch
    # only once, and Lightning's column then showed "0.00it/s" (every epoch of the digits run). A clock
    # of our own: no test here races the machine's speed.
    now = [0.0]
    progress = Progress(get_time=lambda: now[0], disable=True)
    task_id = progress.add_task("Epoch 1", total=10)
    now[0] = 0.5
    progress.update(task_id, completed=10)  # the epoch's one redraw, at its last batch
    (task,) = progress.tasks
    assert task.speed is None  # one sample: rich has no estimate
    bar = ThrottledRichProgressBar()
    lightnings = RichProgressBar().configure_columns(None)[-1]
    (ours,) = [column for column in bar.configure_columns(None) if "Speed" in type(column).__name__]
    assert lightnings.render(task).plain == "0.00it/s"
    assert ours.render(task).plain == "20.00it/s"  # 10 batches in 0.5 s
    assert ours.render(SimpleNamespace(speed=None, completed=0, elapsed=None)).plain == ""  # not started: nothing


def test_every_commands_help_opens_with_a_whole_sentence(capsys: pytest.CaptureFixture) -> None:
    # jsonargparse's --help shows a docstring's first line: `generate --help` once ended "(bytes, or the".
    import {{ cookiecutter.package_name }}.commands as commands

    for found in pkgutil.iter_modules(commands.__path__):
        module = importlib.import_module(f"{commands.__name__}.{found.name}")
        defined = [getattr(module, name, None) for name in (f"main_{found.name}", "main")]
        defined = [function for function in defined if getattr(function, "__module__", None) == module.__name__]
        if not defined:
            continue
        main_function = defined[0]
        with pytest.raises(SystemExit):
            main_function(["--help"])
        description = capsys.readouterr().out.split("\n\n")[1]
        assert description.rstrip().endswith((".", ")")), (found.name, description)


def test_predicts_help_says_what_its_inputs_are_in_this_task(capsys: pytest.CaptureFixture) -> None:
    # The predict command's work is the engine's, the same in every task; what --inputs reads is the task's.
    from {{ cookiecutter.package_name }}.commands import predict

    with pytest.raises(SystemExit):
        predict.main(["--help"])
    description = " ".join(capsys.readouterr().out.split("\n\n")[1].split())
    assert description.startswith("``make predict``: a trained model's predictions"), description
    expected = {{ {"tabular": '"a CSV with the training columns"', "language-model": '"a text file of prompts, one per line"'}.get(cookiecutter.task, '"a .npy array (N, 8, 8)"') }}
    assert expected in description, description


def test_a_new_run_is_named_after_its_config_and_start_time(tmp_path: Path) -> None:
    for _ in range(2):  # two runs in the same second still get folders of their own
        main(["fit", *shrunk_args(tmp_path), "--test_after_fit=false"])
    runs = sorted(path.name for path in (tmp_path / "logs" / "test").iterdir())
    assert len(runs) == 2, runs
    for name in runs:
        assert re.fullmatch(r"default-\d{8}-\d{6}-[0-9a-f]{4}", name), name
    named = "--trainer.logger.init_args.version=mine"
    main(["fit", *shrunk_args(tmp_path), "--test_after_fit=false", named])
    assert (tmp_path / "logs" / "test" / "mine" / "checkpoints" / "last.ckpt").is_file()


def test_the_progress_bar_reads_training_metrics_only_where_the_logger_does(
    cli_args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading a metric the GPU computed waits for every queued step, so the bar, asked to redraw
    # after every batch here, reads fresh values only at the logger's steps and the epoch's end.
    reads: list[int] = []
    lightnings_own = RichProgressBar.get_metrics

    def counted(self, trainer, pl_module):
        if trainer.training:
            reads.append(trainer.global_step)
        return lightnings_own(self, trainer, pl_module)

    monkeypatch.setattr(RichProgressBar, "get_metrics", counted)
    # Lightning turns every stored progress-bar value into a number at each batch end (its result
    # collection): a logged prog_bar=True loss would be read, and waited for, at every step.
    from lightning.pytorch.trainer.connectors.logger_connector import result

    converted: list[int] = []

    def convert(value):
        if cli.trainer.training:
            converted.append(cli.trainer.global_step)
        return lightnings_convert(value)

    lightnings_convert = result.convert_tensors_to_scalars
    monkeypatch.setattr(result, "convert_tensors_to_scalars", convert)
    every_redraw = ["--trainer.log_every_n_steps=4", "--trainer.limit_train_batches=10", "--test_after_fit=false"]
    cli = main([*cli_args, *every_redraw], run=False)
    cli.trainer.progress_bar_callback._refresh_rate = 10**6  # a redraw is due at every batch
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steps = cli.trainer.global_step  # one epoch: 10 batches, or fewer where the data has fewer
    assert steps >= 6
    # The first redraw (nothing read yet), the logger's steps (4, 8), the last batch and the epoch's end.
    assert sorted(set(reads)) == sorted({1, *range(4, steps + 1, 4), steps}), reads
    assert "train/loss" in cli.trainer.progress_bar_callback._shown
    assert converted == []


def test_default_trainer_has_the_documented_callbacks(cli_args: list[str]) -> None:
    trainer = main([*cli_args, "--trainer.enable_model_summary=true"], run=False).trainer
    assert isinstance(trainer.progress_bar_callback, RichProgressBar)
    assert trainer.progress_bar_callback.refresh_rate == 4  # redraws per second (docs/performance.md)
    best, last = (c for c in trainer.callbacks if isinstance(c, ModelCheckpoint))
    assert (best.monitor, best.mode, best.save_top_k) == ("val/loss", "min", 1)
    assert (last.monitor, last.filename) == (None, "last")
    assert trainer.checkpoint_callback is best  # what the after-fit test loads
    assert any(isinstance(c, LearningRateMonitor) for c in trainer.callbacks)
    assert any(isinstance(c, PreemptionCheckpoint) for c in trainer.callbacks)
    assert trainer.gradient_clip_val == 1.0
    (summary,) = [c for c in trainer.callbacks if isinstance(c, LightningModelSummary)]
    assert isinstance(summary, ModelSummaryWithoutZeroFlops)  # ours: no column of zero FLOPs
    quiet = main([*cli_args, "--trainer.enable_progress_bar=false"], run=False).trainer  # summary: false too
    assert quiet.progress_bar_callback is None
    assert not any(isinstance(c, LightningModelSummary) for c in quiet.callbacks)


def test_logger_false_is_a_switch_that_trains_without_any_logger(tmp_path: Path) -> None:
    # The default config's LearningRateMonitor, which Lightning refuses without a logger, goes with it.
    short = ["--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--test_after_fit=false"]
    cli = main(["fit", *shrunk_args(tmp_path), "--trainer.logger=false", *short])
    assert cli.trainer.loggers == [] and cli.trainer.global_step == 2
    assert not any(isinstance(c, LearningRateMonitor) for c in cli.trainer.callbacks)


def test_the_model_summary_shows_flops_only_when_lightning_counted_them(capsys: pytest.CaptureFixture) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    for example, flops_shown in ((None, False), (torch.zeros(3, 8), True)):
        module = L.LightningModule()
        module.net, module.example_input_array = net, example
        module.forward = net.forward
        ModelSummaryWithoutZeroFlops().on_fit_start(L.Trainer(logger=False, enable_progress_bar=False), module)
        shown = capsys.readouterr().out
        assert "Total params: 46" in shown
        assert ("FLOPs" in shown) is flops_shown, shown
    assert "Total FLOPs: 240" in shown  # 3 x (2 x 8 x 4 + 2 x 4 x 2), counted by Lightning


def test_every_preset_is_in_the_suite() -> None:
    assert PRESETS == ["cuda-graphs", "ddp", "debug", "ema", "fsdp", "fsdp2", "gpu", "profile", "trace"]


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_stack_on_the_default(capsys: pytest.CaptureFixture, preset: str) -> None:
    preset_path = CONFIGS / "presets" / f"{preset}.yaml"
    printed = yaml.safe_load(print_config(capsys, f"--config={CONFIGS / 'default.yaml'}", f"--config={preset_path}"))
    preset_config = yaml.safe_load(preset_path.read_text())
    for key, value in preset_config.get("model", {}).get("init_args", {}).items():
        assert printed["model"]["init_args"][key] == value, key
    for key, value in preset_config.get("trainer", {}).items():
        if key.endswith("+"):  # appended to the default's list, which stays
            classes = [entry["class_path"] for entry in printed["trainer"][key.removesuffix("+")]]
            default = yaml.safe_load(print_config(capsys, f"--config={CONFIGS / 'default.yaml'}"))["trainer"]
            assert classes == [entry["class_path"] for entry in default[key.removesuffix("+")] + value]
        elif isinstance(value, dict):  # a class_path block: the class must survive the merge
            assert printed["trainer"][key]["class_path"] == value["class_path"]
        else:
            assert printed["trainer"][key] == value, key
    default_epochs = yaml.safe_load((CONFIGS / "trainer.yaml").read_text())["max_epochs"]
    expected_epochs = {"profile": 2, "trace": 1}.get(preset, default_epochs)
    assert printed["trainer"]["max_epochs"] == expected_epochs  # the default stays unless the preset sets it


@pytest.mark.slow
def test_the_trace_preset_writes_a_timeline_and_names_its_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    preset = CONFIGS / "presets" / "trace.yaml"
    with caplog.at_level(logging.INFO):
        cli = main(["fit", *shrunk_args(tmp_path), f"--config={preset}", "--test_after_fit=false"])
    run = run_dir(cli.trainer)
    (timeline,) = run.glob("fit-trace-*training_step*.pt.trace.json")  # Chrome trace format: Perfetto opens it
    events = json.loads(timeline.read_text())["traceEvents"]
    assert any(event.get("name", "").startswith("aten::") for event in events)  # the operators, on a timeline
    table = (run / "fit-trace.txt").read_text()
    assert "Self CPU" in table  # torch.profiler's operator table
    named = {line.rsplit(" ", 1)[-1] for line in caplog.messages if line.startswith("Profiler report written to")}
    assert {str(timeline), str(run / "fit-trace.txt")} <= named


def test_gradient_accumulation_counts_optimizer_steps(tmp_path: Path) -> None:
    # trainer.accumulate_grad_batches=2: one optimizer step per 2 batches, and the schedule's length
    # (estimated_stepping_batches) counts optimizer steps, so warm-up and decay end where they should.
    args = ["fit", *shrunk_args(tmp_path), "--trainer.accumulate_grad_batches=2", "--test_after_fit=false"]
    cli = main(
        [*args, "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1"]
    )
    batches = cli.trainer.num_training_batches  # 6, or fewer for a small table
    assert cli.trainer.global_step == math.ceil(batches / 2)  # the last, odd batch steps on its own
    scheduler = cli.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.total_steps == cli.trainer.global_step == scheduler.last_epoch


def test_gpu_preset_uses_the_chosen_precision_and_tf32() -> None:
    gpu = yaml.safe_load((CONFIGS / "presets" / "gpu.yaml").read_text())
    assert gpu["trainer"]["precision"] == "{{ cookiecutter.precision }}"
    assert gpu["float32_matmul_precision"] == "high"


def test_test_metrics_name_the_epoch_and_step_of_the_tested_checkpoint(tmp_path: Path) -> None:
    # The best checkpoint by the inverted criterion is the first epoch's, not the last step's.
    best = yaml.safe_load((CONFIGS / "trainer.yaml").read_text())["callbacks"][0]
    assert best["class_path"].endswith("ModelCheckpoint")
    worst = {**best["init_args"], "mode": "min" if best["init_args"]["mode"] == "max" else "max"}
    inverted = tmp_path / "worst.yaml"
    trainer = {"callbacks": [{**best, "init_args": worst}]}
    inverted.write_text(yaml.safe_dump({"trainer": trainer}))
    cli = main(["fit", *shrunk_args(tmp_path), "--trainer.max_epochs=3", f"--config={inverted}"])
    run = Path(cli.trainer.checkpoint_callback.dirpath).parent
    summary = json.loads((run / "test_metrics.json").read_text())
    tested = torch.load(summary["checkpoint"], map_location="cpu", weights_only=True)
    assert (summary["epoch"], summary["global_step"]) == (tested["epoch"], tested["global_step"])
    assert summary["global_step"] < cli.trainer.global_step  # not the end of the run


FIX_THE_VALUE = "; fix the value in the config or on the command line"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--trainer.max_epoch=3", "trainer.max_epoch: no such option; did you mean trainer.max_epochs?"),
        ("--trainer.max_epochs=ten", f"trainer.max_epochs: expected int or null, got 'ten'{FIX_THE_VALUE}"),
        ("--data.init_args.batch_size=many", f"data.init_args.batch_size: expected int, got 'many'{FIX_THE_VALUE}"),
        (
            "--model.init_args.optimizer.init_args.lr=fast",
            f"model.init_args.optimizer.init_args.lr: expected float, got 'fast'{FIX_THE_VALUE}",
        ),
        (
            "--model.init_args.optimizer.init_args.lrr=0.1",
            "model.init_args.optimizer.init_args.lrr: no such option of torch.optim.AdamW; "
            "did you mean model.init_args.optimizer.init_args.lr?",
        ),
        (
            "--model.init_args.net.init_args.dropuot=0.1",
            "model.init_args.net.init_args.dropuot: no such option of {{ cookiecutter.package_name }}.nets.",
        ),
        (
            "--model.init_args.optimizer=torch.optim.Adamw",
            "model.init_args.optimizer.class_path: cannot import torch.optim.Adamw; did you mean torch.optim.Adam?",
        ),
        (
            "--float32_matmul_precision=low",
            f"float32_matmul_precision: expected one of 'highest', 'high', 'medium' or null, got 'low'{FIX_THE_VALUE}",
        ),
        ("--model.init_args.compile_mode=fastest", "model.init_args.compile_mode: expected one of 'default', "),
        # Neither Lightning nor torch refuses it, and a negative factor turns every step up the loss.
        (
            "--trainer.gradient_clip_val=-0.5",
            "trainer.gradient_clip_val=-0.5: give a gradient norm (or value) of at least 0 to clip at; 0 or null "
            "clips nothing",
        ),
        # Refused by torch.optim.AdamW itself, which the module builds only when fit starts: checked before.
        (
            "--model.init_args.optimizer.init_args.lr=-1",
            "model.init_args.optimizer torch.optim.AdamW refused its arguments: Invalid learning rate: -1.0; "
            "fix model.init_args.optimizer.init_args in the config",
        ),
    ],
)
def test_bad_config_is_one_line_naming_the_key_and_the_fix(
    cli_args: list[str], capsys: pytest.CaptureFixture, tmp_path: Path, override: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *cli_args, override])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1].startswith(f"error: {message}"), err[-2000:]
    assert "usage:" not in err and "Traceback" not in err and "Union" not in err
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert written == [], f"a refused config wrote {written}"  # no run folder, no config.yaml


def test_unknown_key_in_a_config_file_names_it_and_its_closest_match(
    cli_args: list[str], capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  max_epoch: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *cli_args, f"--config={typo}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.rstrip().splitlines()
    assert err[-1] == "error: trainer.max_epoch: no such option; did you mean trainer.max_epochs?"
    assert not (tmp_path / "logs").exists()


def test_wandb_is_offline_unless_configured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / ".netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    assert not wandb_is_configured()
    netrc.write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    netrc.chmod(0o600)
    assert wandb_is_configured()
    netrc.unlink()
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_is_configured()


def test_gpu_preset_turns_on_channels_last() -> None:
    gpu = yaml.safe_load((CONFIGS / "presets" / "gpu.yaml").read_text())
    assert gpu["model"]["init_args"]["channels_last"] is True
    assert gpu["data"]["init_args"]["pin_memory"] is True


def test_bf16_falls_back_to_fp16_only_on_a_gpu_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    config = Namespace(accelerator="gpu", precision="bf16-mixed")
    with pytest.warns(UserWarning, match="Tesla V100 has no bfloat16; using 16-mixed"):
        fall_back_to_fp16_without_bf16(config)
    assert config.precision == "16-mixed"
    on_cpu = Namespace(accelerator="cpu", precision="bf16-mixed")
    fall_back_to_fp16_without_bf16(on_cpu)
    assert on_cpu.precision == "bf16-mixed"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    ampere = Namespace(accelerator="gpu", precision="bf16-mixed")
    fall_back_to_fp16_without_bf16(ampere)
    assert ampere.precision == "bf16-mixed"


def test_the_private_lightning_hook_the_training_module_reads_exists() -> None:
    # engine/module.py reads Lightning's private _given_hyperparameters to tell a module built by the
    # CLI (its net's config goes into the checkpoint) from one built in Python. If a Lightning
    # release drops it, checkpoints stop rebuilding their net: this test says so first.
    from {{ cookiecutter.package_name }}.engine import module

    assert module._given_hyperparameters is not None, "lightning.pytorch.core.mixins.hparams_mixin lost it"
{%- if cookiecutter.use_benchmark == 'yes' %}


@pytest.mark.slow
def test_make_bench_times_both_paths_of_the_default_config_and_ends_with_the_overhead_ratio() -> None:
    # `make bench`, shortened: every path (the project's, the plain loop, the loader) in its own
    # process, on this task's default model and data; a JSON summary, the spread of the pair ratios,
    # then overhead_ratio=<float> as the last line.
    done = subprocess.run(
        ["make", "--no-print-directory", "bench", f"PYTHON={sys.executable}", "ARGS=--steps=3 --repeats=1 --no-gpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *report, pairs, last = done.stdout.strip().splitlines()
    assert re.fullmatch(r"overhead_ratio=\d+\.\d{3}", last) and pairs.startswith("pair ratios: min "), last
    figures = json.loads("\n".join(report[report.index("{") : report.index("}") + 1]))
    assert figures["steps"] == 3 and figures["repeats"] == 1 and len(figures["pair_ratios"]) == 1
    assert figures["overhead_ratio"] == pytest.approx(float(last.removeprefix("overhead_ratio=")), abs=1e-3)
    assert figures["overhead_ratio"] == pytest.approx(figures["project_step_ms"] / figures["plain_step_ms"])
    # Whose cost it is: Lightning's loop alone (no callbacks, logger or bar) between the two paths.
    assert figures["lightning_step_ms"] > 0 and len(figures["lightning_step_ms_per_run"]) == 1
    assert figures["lightning_ratio"] == pytest.approx(figures["lightning_step_ms"] / figures["plain_step_ms"])
    assert figures["callbacks_ratio"] == pytest.approx(figures["project_step_ms"] / figures["lightning_step_ms"])
    # The split holds only if the lightning path runs the Trainer bare and the project path with every callback
    # make train has.
    assert figures["lightning_callbacks"] == []
    assert {"ModelCheckpoint", "StopOnNonFinite", "ThrottledRichProgressBar"} <= set(figures["project_callbacks"])
    assert figures["project_step_ms"] > 0 and figures["plain_step_ms"] > 0 and figures["first_step_s"] > 0
    assert figures["loader_samples_per_s"] > 0 and figures["train_samples_per_s"] > 0
    # Eager ops per step of each path, and which Lightning hook or plain-loop stage dispatched them.
    assert figures["eager_ops_ratio"] == pytest.approx(
        figures["project_eager_ops_per_step"] / figures["plain_eager_ops_per_step"]
    )
    assert any(part.startswith("[Strategy]") for part in figures["project_eager_ops_by_part"])
    assert any(part.startswith("plain: ") for part in figures["plain_eager_ops_by_part"])
    assert figures["steps_per_epoch"] > 3 and "project_epoch_end_ms" not in figures  # 3 steps end no epoch


def test_make_bench_reports_an_epoch_end_apart_from_the_step() -> None:
    from {{ cookiecutter.package_name }}.commands.bench import epoch_end_figures, timed

    # Steps of 10 to 12 ms (median 11); the two intervals that span an epoch's end take 50 and 70 ms: the step's
    # median leaves them out (with them it would be 12), and an epoch's end adds their median less a step.
    figures = timed([0.010, 0.011, 0.050, 0.070, 0.012], [False, False, True, True, False], 1)
    assert figures["step_ms"] == pytest.approx(11.0) and figures["epoch_end_ms"] == pytest.approx(49.0)
    # Timed every 2 steps: an interval is half of two steps, and one that spans an epoch's end holds two steps too.
    assert timed([0.010, 0.035, 0.010], [False, True, False], 2)["epoch_end_ms"] == pytest.approx(50.0)
    assert timed([0.010, 0.010], [False, False], 1)["epoch_end_ms"] is None
    shared = epoch_end_figures({"project": [60.0, 50.0, 40.0], "plain": [25.0]}, steps_per_epoch=10)
    assert shared == {
        "project_epoch_end_ms": 50.0,
        "project_epoch_end_ms_per_step": 5.0,
        "plain_epoch_end_ms": 25.0,
        "plain_epoch_end_ms_per_step": 2.5,
        "epoch_end_ratio": 2.0,
    }
    assert epoch_end_figures({"project": [50.0], "plain": []}, steps_per_epoch=10) == {}
{%- endif %}
