"""The SLURM batch script: consistent resources, pre-emption settings, and a command line that parses."""

import re
import shlex
import subprocess

import pytest
import yaml
from conftest import ROOT

from {{ cookiecutter.package_name }}.cli import main

SCRIPT = ROOT / "scripts" / "slurm" / "train.sbatch"


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
    command = re.search(r"^srun .*? fit (.*) \"\$@\"$", script, flags=re.MULTILINE)
    assert command, "srun ... fit line not found"
    text = command.group(1).replace("$PRESETS", presets)
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
