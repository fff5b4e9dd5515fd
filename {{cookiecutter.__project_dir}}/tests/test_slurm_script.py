"""The SLURM batch script: consistent resources, pre-emption settings, and a command line that parses."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from {{ cookiecutter.package_name }}.cli import main

SCRIPT = ROOT / "scripts" / "slurm" / "train.sbatch"
{%- if cookiecutter.use_sweeps == 'yes' %}
SWEEP_SCRIPT = ROOT / "scripts" / "slurm" / "sweep.sbatch"
{%- endif %}


def sbatch_options() -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)", SCRIPT.read_text(), flags=re.MULTILINE))


def test_one_task_per_gpu_and_preemption_requeue() -> None:
    options = sbatch_options()
    assert options["ntasks-per-node"] == options["gpus-per-node"]
    assert options["signal"].startswith("SIGUSR1@")
    assert options["open-mode"] == "append"
    assert re.search(r"^#SBATCH --requeue$", SCRIPT.read_text(), flags=re.MULTILINE)


def test_script_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_command_it_runs_parses(capsys: pytest.CaptureFixture) -> None:
    """The srun command line, with the allocation's variables filled in, is a valid config."""
    script = SCRIPT.read_text().replace("\\\n", " ")  # join continued lines
    presets = re.search(r'PRESETS="\$\{PRESETS:-(.*)\}"', script).group(1)
    command = re.search(r"^srun .*? fit (.*) \"\$@\" (.*) \|\| status=\$\?$", script, flags=re.MULTILINE)
    assert command, "srun ... fit line not found"
    text = f"{command.group(1)} {command.group(2)}".replace("$PRESETS", presets)
    text = text.replace('"$SLURM_JOB_NUM_NODES"', "2").replace('"$SLURM_NTASKS_PER_NODE"', "4")
    args = [arg.replace("configs/", f"{ROOT}/configs/") for arg in shlex.split(text)]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    trainer = yaml.safe_load(capsys.readouterr().out)["trainer"]
    assert trainer["num_nodes"] == 2
    assert str(trainer["devices"]) == "4"  # Lightning accepts the count as int or str
    assert trainer["strategy"] == "ddp"
    assert trainer["accelerator"] == "gpu"


def run_script(tmp_path: Path, srun_status: int = 0, args: tuple[str, ...] = (), script: Path = SCRIPT, **env: str):
    """Run the batch script as slurmd would, with a fake srun that records its arguments."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/srun-args\nexit {srun_status}\n')
    (fake / "srun").chmod(0o755)
    allocation = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4"}
    allocation |= {"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_SUBMIT_DIR": str(ROOT)}
    environment = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", **allocation, **env}
    environment = {key: value for key, value in environment.items() if value != "unset"}
    done = subprocess.run(["bash", str(script), *args], env=environment, capture_output=True, text=True)
    srun_args = (tmp_path / "srun-args").read_text().splitlines() if (tmp_path / "srun-args").exists() else None
    return done, srun_args


def test_script_passes_arguments_through_and_sizes_the_trainer_from_the_allocation(tmp_path: Path) -> None:
    done, srun_args = run_script(tmp_path, args=("--trainer.max_epochs=3", "--seed_everything=7"))
    assert done.returncode == 0, done.stderr
    # The allocation's sizes come last: an argument (a preset's devices: auto) must not undo them.
    assert srun_args[-4:] == [
        "--trainer.max_epochs=3",
        "--seed_everything=7",
        "--trainer.num_nodes=2",
        "--trainer.devices=4",
    ]
    assert "srun exited with status 0" in done.stdout


def test_script_exits_with_the_status_of_srun(tmp_path: Path) -> None:
    # Otherwise a failed training would read COMPLETED in sacct.
    done, _ = run_script(tmp_path, srun_status=3)
    assert done.returncode == 3
    assert "srun exited with status 3" in done.stdout


def test_script_refuses_ntasks_without_ntasks_per_node(tmp_path: Path) -> None:
    done, srun_args = run_script(tmp_path, SLURM_NTASKS_PER_NODE="unset")
    assert done.returncode != 0 and srun_args is None
    assert "set --ntasks-per-node (one task per GPU), not --ntasks" in done.stderr


def test_script_refuses_a_task_count_unequal_to_the_gpu_count(tmp_path: Path) -> None:
    done, srun_args = run_script(tmp_path, SLURM_GPUS_ON_NODE="8")
    assert done.returncode == 2 and srun_args is None
    assert "--gpus-per-node=8 but --ntasks-per-node=4" in done.stderr
{%- if cookiecutter.use_sweeps == 'yes' %}


def test_the_sweep_array_runs_workers_of_one_study_with_the_gpu_preset(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    subprocess.run(["bash", "-n", str(SWEEP_SCRIPT)], check=True)
    assert re.search(r"^#SBATCH --array=\S+", SWEEP_SCRIPT.read_text(), flags=re.MULTILINE)
    done, srun_args = run_script(tmp_path, args=("--n_trials=40",), script=SWEEP_SCRIPT, SLURM_ARRAY_TASK_ID="1")
    assert done.returncode == 0, done.stderr
    module = srun_args.index("{{ cookiecutter.package_name }}.commands.sweep")
    assert srun_args[module + 1 :] == [
        "--config",
        "configs/sweep.yaml",
        "--args+=--config=configs/presets/gpu.yaml",
        "--n_trials=40",
    ]
    # The arguments parse: every worker reads the same sweep file, so they share its study.
    from {{ cookiecutter.package_name }}.commands.sweep import main as sweep_main

    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        sweep_main([*srun_args[module + 1 :], "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["args"][-1] == "--config=configs/presets/gpu.yaml" and printed["n_trials"] == 40
{%- endif %}


@pytest.mark.parametrize("script", [SCRIPT{{ ", SWEEP_SCRIPT" if cookiecutter.use_sweeps == 'yes' else "" }}], ids=["train"{{ ', "sweep"' if cookiecutter.use_sweeps == 'yes' else "" }}])
def test_a_job_stops_before_srun_when_venv_differs_from_uv_lock(tmp_path: Path, script: Path) -> None:
    """The job runs in the locked environment: `uv sync --check` (here a fake uv) decides, offline."""
    project = tmp_path / "project"
    (project / "scripts" / "slurm").mkdir(parents=True)
    (project / "scripts" / "slurm" / "locked_env.sh").write_text((ROOT / "scripts/slurm/locked_env.sh").read_text())
    (project / "uv.lock").write_text("version = 1\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "uv").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/uv-args\nexit "$UV_STATUS"\n')
    (fake / "uv").chmod(0o755)
    where = {"SLURM_SUBMIT_DIR": str(project), "PYTHON": ".venv/bin/python"}

    done, srun_args = run_script(tmp_path, script=script, UV_STATUS="1", **where)
    assert done.returncode == 2 and srun_args is None
    assert "error: .venv does not match uv.lock; run `make install`" in done.stderr
    uv_args = (tmp_path / "uv-args").read_text().split()
    assert uv_args[:2] == ["sync", "--offline"] and {"--locked", "--check", "--inexact"} <= set(uv_args)

    done, srun_args = run_script(tmp_path, script=script, UV_STATUS="0", **where)
    assert done.returncode == 0 and srun_args is not None, done.stderr
    (tmp_path / "srun-args").unlink()
    done, srun_args = run_script(tmp_path, script=script, UV_STATUS="1", LOCK_CHECK="0", **where)
    assert done.returncode == 0 and srun_args is not None, done.stderr  # the documented way to skip it
