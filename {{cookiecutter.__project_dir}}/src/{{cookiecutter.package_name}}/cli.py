"""The command line: ``python -m {{ cookiecutter.package_name }} fit|validate|test|predict --config ...``.

LightningCLI (https://lightning.ai/docs/pytorch/stable/cli/lightning_cli.html) with the project's run
policy (:class:`engine.training_cli.TrainingCLI`: resume, the trust rule, one-line errors, the test
after fit). What is this task's own is here: the links that let the data decide the model's shapes.
"""

from {{ cookiecutter.package_name }}.engine import TrainingCLI, run_cli


class CLI(TrainingCLI):
    """The project's LightningCLI: the task's links on top of :class:`engine.training_cli.TrainingCLI`."""

    def add_arguments_to_parser(self, parser) -> None:
{%- if cookiecutter.task == "tabular" %}
        # The table decides the input width, the task, the output width (classes, or 1 for a
        # regression target) and the names: the model and its net cannot disagree with it.
        for source, target in (
            ("data.num_features", "model.init_args.net.init_args.in_features"),
            ("data.num_outputs", "model.init_args.net.init_args.out_features"),
            ("data.num_outputs", "model.init_args.num_outputs"),
            ("data.task", "model.init_args.task"),
            ("data.target_scale", "model.init_args.target_scale"),
            ("data.class_names", "model.init_args.class_names"),
        ):
            parser.link_arguments(source, target, apply_on="instantiate")
{%- elif cookiecutter.task == "language-model" %}
        # The data decides the tokenizer (bytes, or a pretrained model's), so the vocabulary, and the
        # context length the net is built for; the model decodes with the same tokenizer.
        parser.link_arguments("data.vocab_size", "model.init_args.net.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.block_size", "model.init_args.net.init_args.block_size", apply_on="instantiate")
        parser.link_arguments("data.tokenizer_source", "model.init_args.tokenizer", apply_on="instantiate")
{%- else %}
        # The data decides the number of classes and channels; the model and its net cannot disagree.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.net.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_channels", "model.init_args.net.init_args.in_channels", apply_on="instantiate")
{%- endif %}
        super().add_arguments_to_parser(parser)


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Run the CLI on ``args`` (default: ``sys.argv[1:]``) and return it.

    A user error (:class:`engine.errors.UserError`: a config, data, checkpoint or launch mistake)
    prints one line ``error: ...`` and exits 2; jsonargparse does the same for unknown options and
    wrong types. Any other exception is a bug and keeps its traceback.

    With ``run=False`` there is no subcommand: the CLI only parses ``args`` and builds the
    Trainer, model and DataModule (``cli.trainer``, ``cli.model``, ``cli.datamodule``).
    """
    return run_cli(CLI, args, run)


if __name__ == "__main__":
    main()
