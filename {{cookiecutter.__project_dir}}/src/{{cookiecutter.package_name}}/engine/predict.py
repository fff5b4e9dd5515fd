"""``make predict``'s work, the same for every task: a checkpoint's predictions over the test split or your own
inputs, written to a file (``commands/predict.py`` is its command line).

The checkpoint alone rebuilds the model and its DataModule (:func:`engine.inference.load_trained`):
no training config is needed. Lightning's ``Trainer.predict`` runs the model's ``predict_step``
and :class:`engine.callbacks.PredictionWriter` writes one row per sample. What ``inputs`` reads is
the DataModule's ``read_inputs`` (``engine/contract.py``).
"""

from pathlib import Path

import lightning as L
from lightning.fabric.plugins.environments import LightningEnvironment

from .callbacks import PredictionWriter
from .inference import load_trained, trusted_modules
from .run_folders import best_checkpoint


def write_predictions(
    ckpt: Path | None = None,
    inputs: str | None = None,
    output: Path | None = None,
    accelerator: str = "auto",
    trust: str | None = None,
) -> Path:
    """Write predictions of checkpoint ``ckpt`` and return the file's path.

    Args:
        ckpt: the checkpoint; default the best of the latest run under logs/.
        inputs: your own inputs, a file or folder the DataModule's ``read_inputs`` reads; default the test split.
        output: the file, .csv or .jsonl; default predictions.csv (.jsonl for text) in the checkpoint's run
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
    model, data = trained.model, trained.datamodule
    if inputs is None:
        data.setup("predict")  # the test split; your own inputs need only what the checkpoint holds
    data.use_inputs(inputs)
    default = PredictionWriter.default_path(path, model.prediction_format, inputs)  # the test split's, or inputs' own
    writer = PredictionWriter(str(output or default))
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
    trainer.predict(model, datamodule=data, return_predictions=False)
    return writer.written
