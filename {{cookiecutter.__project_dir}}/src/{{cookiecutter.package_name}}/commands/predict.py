"""``make predict``: a trained model's predictions over the test split or your own inputs, written to a file.

    python -m {{ cookiecutter.package_name }}.commands.predict                       # best checkpoint of the latest run, test split
    python -m {{ cookiecutter.package_name }}.commands.predict --inputs my_rows.csv --output predictions.jsonl
    python -m {{ cookiecutter.package_name }}.commands.predict --ckpt logs/.../checkpoints/epoch004-....ckpt

The checkpoint alone rebuilds the model and its DataModule (:func:`engine.inference.load_trained`):
no training config is needed. Lightning's ``Trainer.predict`` runs the model's ``predict_step``
and :class:`engine.callbacks.PredictionWriter` writes one row per sample. What ``--inputs`` reads
is the DataModule's ``read_inputs``: see ``--help`` and the README.
"""

from pathlib import Path

import lightning as L
from jsonargparse import auto_cli
from lightning.fabric.plugins.environments import LightningEnvironment

from {{ cookiecutter.package_name }}.engine.callbacks import PredictionWriter
from {{ cookiecutter.package_name }}.engine.errors import exit_on_user_error
from {{ cookiecutter.package_name }}.engine.inference import load_trained, trusted_modules
from {{ cookiecutter.package_name }}.engine.quiet import silence_dependency_noise, silence_srun_hint
from {{ cookiecutter.package_name }}.engine.runs import best_checkpoint


def predict(
    ckpt: Path | None = None,
    inputs: str | None = None,
    output: Path | None = None,
    accelerator: str = "auto",
    trust: str | None = None,
) -> Path:
    """Write predictions of checkpoint ``ckpt`` and return the file's path.

    Args:
        ckpt: the checkpoint; default the best of the latest run under logs/.
        inputs: your own inputs; default the test split.
{%- if cookiecutter.task == "tabular" %} A CSV with the training columns (the target
            column may be absent).
{%- elif cookiecutter.task == "language-model" %} A text file of prompts, one per line.
{%- else %} Digits: a .npy array (N, 8, 8) or a CSV of 64 pixel
            values 0-16 per row, no header. An image-folder model: a folder of images (subfolders
            too) or one image file, resized as in training.
{%- endif %}
        output: the file, .csv or .jsonl; default predictions.{{ 'jsonl' if cookiecutter.task == 'language-model' else 'csv' }} in the checkpoint's run
            folder, and for ``inputs`` a file of their own there (``PredictionWriter.default_path``).
        accelerator: Lightning accelerator: "auto", "cpu", "gpu".
        trust: modules besides this project's package whose classes the checkpoint may name,
            comma-separated (an own DataModule or net kept elsewhere); only for checkpoints you trust.

    Raises:
        FileNotFoundError: no checkpoint, or no inputs file.
        ValueError: inputs the DataModule cannot read (the message names the file and the fix).
    """
    path = Path(ckpt) if ckpt is not None else best_checkpoint("logs")
    trained = load_trained(path, trust=trusted_modules(trust))
    data = trained.datamodule
    if inputs is None:
        data.setup("predict")  # the test split; your own inputs need only what the checkpoint holds
    data.use_inputs(inputs)
    file_format = trained.model.prediction_format
    default = PredictionWriter.default_path(path, file_format, inputs)  # the test split's, or these inputs' own
    writer = PredictionWriter(str(output) if output else str(default))
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        plugins=[LightningEnvironment()],  # one process here, even inside a SLURM allocation
        callbacks=[writer],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.predict(trained.model, datamodule=data, return_predictions=False)
    return writer.written


def main(args: list[str] | None = None) -> None:
    silence_dependency_noise()
    silence_srun_hint()  # one process, even inside a SLURM allocation (LightningEnvironment below)
    with exit_on_user_error("predict"):  # a missing checkpoint or unreadable inputs: one line, exit 2
        auto_cli(predict, args=args)


if __name__ == "__main__":
    main()
