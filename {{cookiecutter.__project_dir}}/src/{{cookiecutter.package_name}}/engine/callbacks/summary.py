"""Lightning's rich model summary, without a column of zero FLOPs."""

from typing import Any

from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import get_formatted_model_size, get_human_readable_count


class ModelSummaryWithoutZeroFlops(RichModelSummary):
    """Lightning's ``RichModelSummary``; the FLOPs column and total only when they were counted.

    Lightning counts FLOPs by running the LightningModule's ``example_input_array`` through it.
    This project's modules leave it unset (their batches' shapes are the DataModule's decision, and
    a forward pass at the start of fit would run the DataModule's batch transforms), so Lightning
    would print 0 FLOPs for every layer and in total. Set ``example_input_array`` on your module and
    the column returns, filled.
    """

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        if total_flops:
            counts = (total_parameters, trainable_parameters, model_size, total_training_modes, total_flops)
            RichModelSummary.summarize(summary_data, *counts, **summarize_kwargs)
            return
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != "FLOPs"]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            numeric = name.startswith("Params") or name.endswith("sizes")
            table.add_column(name, justify="right" if numeric else "left", style="dim" if name == " " else None)
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        totals = Table.grid(expand=True)
        totals.add_column()
        totals.add_row(f"[bold]Trainable params[/]: {get_human_readable_count(int(trainable_parameters))}")
        totals.add_row(
            f"[bold]Non-trainable params[/]: {get_human_readable_count(int(total_parameters - trainable_parameters))}"
        )
        totals.add_row(f"[bold]Total params[/]: {get_human_readable_count(int(total_parameters))}")
        totals.add_row(f"[bold]Total estimated model params size (MB)[/]: {get_formatted_model_size(model_size)}")
        totals.add_row(f"[bold]Modules in train mode[/]: {total_training_modes['train']}")
        totals.add_row(f"[bold]Modules in eval mode[/]: {total_training_modes['eval']}")
        console = get_console()
        console.print(table)
        console.print(totals)
