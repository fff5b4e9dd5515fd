"""``make predict``: a trained model's predictions over the test split or your own inputs, written to a file.

    python -m {{ cookiecutter.package_name }}.commands.predict                       # best checkpoint of the latest run, test split
    python -m {{ cookiecutter.package_name }}.commands.predict --inputs {{ {"tabular": "my_rows.csv", "language-model": "prompts.txt"}.get(cookiecutter.task, "my_digits.npy") }} --output predictions.jsonl
    python -m {{ cookiecutter.package_name }}.commands.predict --ckpt logs/.../checkpoints/epoch004-....ckpt

What ``--inputs`` reads is the DataModule's ``read_inputs``:
{%- if cookiecutter.task == "tabular" %} a CSV with the training columns (the target
column may be absent).
{%- elif cookiecutter.task == "language-model" %} a text file of prompts, one per line.
{%- else %} for the digits a .npy array (N, 8, 8) or a CSV of 64
pixel values 0-16 per row, no header; for an image-folder model a folder of images (subfolders too) or one
image file, resized as in training.
{%- endif %}
The work, the same for every task, is :func:`engine.predict.write_predictions`.
"""

from jsonargparse import auto_cli

from {{ cookiecutter.package_name }}.engine import exit_on_user_error, silence_dependency_noise, silence_srun_hint
from {{ cookiecutter.package_name }}.engine import write_predictions as predict

DESCRIPTION = f"{__doc__.split(chr(10))[0]} {__doc__.split(chr(10) * 2)[-1]}"  # --help: what it does, what it reads


def main(args: list[str] | None = None) -> None:
    silence_dependency_noise()
    silence_srun_hint()  # one process, even inside a SLURM allocation (engine.predict runs one)
    with exit_on_user_error("predict"):  # a missing checkpoint or unreadable inputs: one line, exit 2
        auto_cli(predict, args=args, description=DESCRIPTION)


if __name__ == "__main__":
    main()
