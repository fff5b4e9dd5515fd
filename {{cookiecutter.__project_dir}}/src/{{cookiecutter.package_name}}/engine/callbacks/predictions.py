"""``PredictionWriter``: predictions streamed to a file a person reads, through Lightning's ``BasePredictionWriter``.

https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.callbacks.BasePredictionWriter.html
"""

import csv
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info

from ..errors import DataError
from ..inference import nonfinite_message, nonfinite_rows


class PredictionWriter(BasePredictionWriter):
    """Writes one row per predicted sample: its id, then the task module's ``describe`` record.

    For a classifier a row is ``id,label,probability``; regression writes ``id,prediction``; the
    language model writes ``prompt`` and ``completion``. Where the DataModule knows each input's true
    label or value (``truth``: the test split of a classifier, a table with its target column), a
    ``true_label`` (``true_value``) column follows. Rows are written after every batch, so
    memory stays flat on a large input set. Ids come from the DataModule (``predict_ids``: row
    numbers of the test split, file names, CSV rows); class names from its ``class_names``.
    They go to ``<file>.partial``, renamed to the file when the last batch is written: an
    interrupted run leaves the previous file as it was and its own rows in the ``.partial`` one.

    Args:
        path: the file; its suffix picks the format: ``.csv`` or ``.jsonl``. Default:
            ``predictions.csv`` in the run folder of the checkpoint being predicted with
            (``<run>/checkpoints/x.ckpt`` -> ``<run>/predictions.csv``), else in the working folder.
        file_format: used for the default path: "csv" or "jsonl".

    Under DDP each process writes its own share to ``<stem>.rank<N><suffix>``.
    """

    def __init__(self, path: str | None = None, file_format: Literal["csv", "jsonl"] = "csv") -> None:
        super().__init__(write_interval="batch")
        self.path, self.file_format = path, file_format
        self.written: Path | None = None
        self._file: Any = None
        self._csv: csv.DictWriter | None = None
        self._count = 0

    @staticmethod
    def default_path(ckpt_path: str | Path | None, file_format: str = "csv", inputs: str | Path | None = None) -> Path:
        """``<run>/predictions.<file_format>`` for a checkpoint in ``<run>/checkpoints/``, else the working folder's.

        For your own ``inputs``: ``predictions-<their name>-<8 hex digits of their absolute path's
        SHA-256>.<file_format>``, so predictions for other inputs never replace the test split's or
        each other's (the same inputs again rewrite their own file).
        """
        ckpt = Path(ckpt_path) if ckpt_path else None
        folder = ckpt.parent.parent if ckpt is not None and ckpt.parent.name == "checkpoints" else Path()
        if inputs is None:
            return folder / f"predictions.{file_format}"
        source = Path(inputs).expanduser().resolve()
        name = re.sub(r"[^\w.-]", "_", source.name)[:64] or "inputs"
        digest = hashlib.sha256(str(source).encode()).hexdigest()[:8]
        return folder / f"predictions-{name}-{digest}.{file_format}"

    def output_path(self, trainer: L.Trainer) -> Path:
        """Where this process writes (see the class docstring)."""
        path = Path(self.path) if self.path is not None else self.default_path(trainer.ckpt_path, self.file_format)
        if trainer.world_size > 1:
            path = path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")
        return path

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.written = self.output_path(trainer)
        self.written.parent.mkdir(parents=True, exist_ok=True)
        self._file = self._partial().open("w", newline="", encoding="utf-8")
        self._csv, self._count = None, 0

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: torch.Tensor,
        batch_indices: list[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        datamodule = trainer.datamodule
        class_names = [str(name) for name in getattr(datamodule, "class_names", None) or []]
        if batch_indices is None:  # a sampler Lightning cannot see into: positions in order
            batch_indices = range(self._count, self._count + len(prediction))
        ids = getattr(datamodule, "predict_ids", None) or []
        bad = nonfinite_rows(prediction)
        if bad:  # never a nan in the file: the input is named, nothing more is written
            index = list(batch_indices)[bad[0]]
            name = ids[index] if index < len(ids) else str(index)
            raw = getattr(datamodule, "predict_raw", None)  # your inputs as read; None for the test split
            raise DataError(
                f"input {name}: {nonfinite_message(datamodule, raw, index)}; fix or leave out that input "
                f"(the predictions before it are in {self._partial()})"
            )
        records = pl_module.describe(prediction.detach().cpu(), class_names)
        truth = getattr(datamodule, "predict_truth", None)  # the true label or value of each input, when known
        for index, record in zip(batch_indices, records, strict=True):
            row = {"id": ids[index] if index < len(ids) else str(index), **record}
            if truth is not None:
                row["true_label" if class_names else "true_value"] = truth[index]
            if self.written.suffix == ".jsonl":
                self._file.write(json.dumps(row, ensure_ascii=False) + "\n")
                continue
            if self._csv is None:
                self._csv = csv.DictWriter(self._file, fieldnames=list(row))
                self._csv.writeheader()
            self._csv.writerow(row)
        self._count += len(records)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
            os.replace(self._partial(), self.written)
            rank_zero_info(f"{self._count} predictions written to {self.written}")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._file is not None:  # the rows written so far stay readable in the .partial file
            self._file.close()
            self._file = None

    def _partial(self) -> Path:
        return self.written.with_name(f"{self.written.name}.partial")
