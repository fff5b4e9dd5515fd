"""The task-free half of ``python -m <package> fit|validate|test|predict``: :class:`TrainingCLI`.

Built on LightningCLI (https://lightning.ai/docs/pytorch/stable/cli/lightning_cli.html): every
option of the Trainer, the LightningModule and the LightningDataModule comes from their type
hints, configs stack with repeated ``--config``, and an unknown key or a wrong type stops the run
with jsonargparse's message before anything is built or trained. What this adds is the run policy
of every task: its options (``--resume``, ``--trust``, ``--test_after_fit``,
``--float32_matmul_precision``), the trust rule on checkpoints (data; configs are code), a checkpoint read
once and checked before anything runs, one-line errors, and the test of the best checkpoint after
fit. The task's own ``cli.py`` holds only its links (which data attribute sets which model argument).
"""

import os
import sys
from pathlib import Path
from typing import Literal

import lightning as L
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.utilities import rank_zero_info

from . import preflight
from .checkpoints import (
    FITS_FIX,
    AtomicCheckpointIO,
    CheckpointError,
    check_fits,
    check_optimizer_continues,
    check_training_state,
    read_checkpoint,
    read_distributed_state,
)
from .datamodule import ResumableDataModule, check_resume_position
from .errors import (
    ConfigError,
    UserError,
    check_config_files,
    exit_on_user_error,
    lightning_config_error,
    readable_parser_message,
    user_error_in,
)
from .import_guard import loading, refusal_while_loading
from .launch import check_world_size, slurm_job_id
from .module import TrainingModule
from .quiet import (
    drop_wandb_anonymous,
    replace_resume_warnings,
    replace_srun_hint,
    silence_dependency_noise,
    silence_predict_warnings,
    silence_srun_hint,
)
from .run_folders import (
    announce_run,
    remove_unstarted_run_dir,
    run_dir,
    run_to_resume,
)
from .run_records import (
    SaveConfigToRunDir,
    evaluate_best_checkpoint,
    keep_csv_metrics,
    own_config,
    profile_into_run_dir,
    report_profiler_files,
    with_own_config,
)
from .trust import (
    LIGHTNING_OWN,
    PROJECT_PACKAGE,
    UntrustedCheckpointError,
    check_checkpoint,
    checkpoint_arguments,
    trusted_by_arguments,
    trusted_by_config_files,
)

# Lightning's own names for checkpoints that are not a file path (trainer.fit(ckpt_path=...)).
_NAMED_CHECKPOINTS = ("best", "last", "hpc", "registry")


class Parser(LightningArgumentParser):
    """LightningCLI's parser; a mistake is one line naming the key, the problem and the fix (exit 2).

    jsonargparse would print the whole usage (some 50 lines) and its nested type-union message;
    an unknown key gets the closest accepted one ("did you mean trainer.max_epochs?").
    """

    def error(self, message: str, ex: Exception | None = None):
        refusal = refusal_while_loading(ex or message)  # a checkpoint or run folder named code: say so
        if refusal is not None:
            raise UntrustedCheckpointError(refusal) from ex
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)  # a nested parser's error, caught and handled by jsonargparse
        parser = getattr(ex, "subcommand_parser", None) or self
        readable = readable_parser_message(message, _option_keys(parser))
        print(f"error: {readable}", file=sys.stderr)
        raise SystemExit(2) from ConfigError(readable)  # the message stays reachable, as exit_on_user_error's


class TrainingCLI(LightningCLI):
    """LightningCLI with the project's run policy: its options, the trust rule, one read of a checkpoint,
    resume, one-line errors and the test after fit. A task's ``cli.CLI`` subclasses it with its links."""

    # fit --resume=true: the run's own config, and the arguments given on top of it that may change its model.
    resumed_with: tuple[Path, list[str]] | None = None
    # (arguments, their file) when the objects are built from a checkpoint's arguments: data, under the trust rule.
    _building_from: tuple[object, Path | str] | None = None
    # The --ckpt_path checkpoint's model and DataModule arguments, read once when the arguments are parsed.
    _ckpt_arguments: dict | None = None
    # Every checkpoint this command read, by path: a file is read once per command.
    _checkpoints: dict[str, dict] | None = None

    def add_arguments_to_parser(self, parser) -> None:
        """The project's own options; a task's CLI adds its links (``parser.link_arguments``) and calls this."""
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"] | None,
            default=None,
            help="torch.set_float32_matmul_precision: 'high' lets float32 matmuls use TF32 on Ampere+ GPUs.",
        )
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="After fit, test the best checkpoint and write test_metrics.json into the run folder.",
        )
        parser.add_argument(
            "--trust",
            type=str | None,
            default=None,
            help="Modules (comma-separated) whose classes a --ckpt_path checkpoint may name besides this project's, "
            "torch.nn, torch.optim and what the command line and its configs name; only for checkpoints you vouch "
            "for (docs/trust.md).",
        )
        parser.add_argument(
            "--resume",
            type=bool,
            default=False,
            help="fit: continue the latest run of this experiment (its run folder and logger run) from its "
            "newest checkpoint (last.ckpt or an interrupted-step*.ckpt). `make resume` sets it.",
        )

    def parse_arguments(self, parser, args) -> None:
        given = sys.argv[1:] if args is None else list(args)
        # What the user vouches for: the command line and the configs it names (configs/ and any --config: a config
        # is code, whoever wrote it) and --trust. A checkpoint is data (engine/trust.py).
        self.trusted = (*trusted_by_arguments(given), *trusted_by_config_files())
        super().parse_arguments(parser, args)
        # LightningCLI reads the checkpoint's hyperparameters right after parsing (they override
        # the model config, and jsonargparse imports the names in them): read it first, so a missing,
        # truncated or corrupt file is named, and check every name in it (engine/trust.py).
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and self.config[subcommand].get("resume"):
            raise ConfigError(
                "--resume and --ckpt_path: give only one (--resume picks the latest run's newest checkpoint)"
            )
        if subcommand == "fit" and self.config.fit.get("resume") and not slurm_job_id():
            # A run continues as it was configured: rebuilt from its own saved config, the other
            # arguments on top (a requeued SLURM job runs the very command it started with).
            config = own_config(run_to_resume(self.config.fit.trainer))
            if config is not None:
                rank_zero_info(f"Resuming with the run's own config, {config}, and the other arguments given")
                self.trusted = (*self.trusted, *trusted_by_config_files([config]))
                # The command line, rewritten, is passed as args: sys.argv is set aside meanwhile, or
                # LightningCLI would warn that both were given (they are the same command).
                argv, sys.argv = sys.argv, sys.argv[:1]
                try:
                    super().parse_arguments(parser, with_own_config(given, config))
                finally:
                    sys.argv = argv
                others = [arg for arg in given if arg != "fit" and not arg.startswith(("--config", "--resume"))]
                # The --model ones change a model most directly; else any (a --data one changes the classes).
                self.resumed_with = (config, [arg for arg in others if arg.startswith("--model")] or others)
        if _is_checkpoint_file(ckpt_path):
            checkpoint = self._read_checkpoint(ckpt_path)
            check_checkpoint(checkpoint, ckpt_path, self.trusted)
            # Read once, parsed by _parse_ckpt_path: the model's arguments less its optimizer and schedule.
            self._ckpt_arguments = checkpoint_arguments(checkpoint, ckpt_path, self.trusted)

    def _read_checkpoint(self, path: str) -> dict:
        if self._checkpoints is None:
            self._checkpoints = {}
        if path not in self._checkpoints:
            # A distributed checkpoint (a folder): its states besides the shards, to check them as a file's.
            read = read_distributed_state if Path(path).is_dir() else read_checkpoint
            self._checkpoints[path] = read(Path(path))
        return self._checkpoints[path]

    def _parse_ckpt_path(self) -> None:
        # In place of LightningCLI's, which reads the file again and parses all the model's saved arguments:
        # the checked ones read once, less the optimizer and schedule (the user's config decides those), under
        # the trust rule.
        subcommand = self.config.get("subcommand")
        arguments = dict((self._ckpt_arguments or {}).get("hyper_parameters") or {})
        arguments.pop("_instantiator", None)
        if not subcommand or not arguments:
            return
        if "_class_path" in arguments:
            arguments = {"class_path": arguments.pop("_class_path"), "dict_kwargs": arguments}
        self._building_from = (self._ckpt_arguments, self.config[subcommand].get("ckpt_path"))
        with loading(*self._building_from, self.trusted, also=LIGHTNING_OWN):
            model = {"model": arguments}
            self.config = self.parser.parse_object({subcommand: model}, self.config)

    def instantiate_classes(self) -> None:
        # Objects built from a checkpoint's arguments: under the trust rule too.
        if self._building_from is None:
            return self._instantiate_classes()
        with loading(*self._building_from, self.trusted, also=LIGHTNING_OWN):
            self._instantiate_classes()

    def _instantiate_classes(self) -> None:
        # jsonargparse wraps what a constructor raises in its own ValueError. Our own argument checks
        # (a UserError such as ConfigError, raised by nets/ too) become one line; anything else is a
        # bug in a constructor and keeps its traceback.
        try:
            super().instantiate_classes()
        except ValueError as error:
            cause = user_error_in(error)
            if cause is None or cause is error:
                raise
            raise cause from error

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except (UserError, ValueError) as error:
            # A data or config mistake found once fit started (a DataModule's setup, Lightning's own
            # checks of the loaders): one line, and the run folder made for it is not left behind.
            user = error if isinstance(error, UserError) else lightning_config_error(error)
            if user is None:
                raise
            if subcommand == "fit" and self.trainer.is_global_zero:
                remove_unstarted_run_dir(self.trainer)
            if user is error:
                raise
            raise user from error

    def before_instantiate_classes(self) -> None:
        preflight.prepare(self.config.get(self.subcommand, self.config), self.subcommand)

    def after_instantiate_classes(self) -> None:
        # Before any process group is set up: a mismatch fails here instead of hanging later.
        check_world_size(self.trainer)
        drop_wandb_anonymous(self.trainer.loggers)
        if self.subcommand == "fit" and isinstance(self.model, TrainingModule):
            # The optimizer is built when fit starts, after the run folder exists: check its arguments now.
            self.model.check_optimizer()
            if self.config_init.fit.get("ckpt_path") or self.config_init.fit.get("resume"):
                self.model.skip_init_from()  # a resumed run restores its own weights
            else:
                self.model.check_init_from()

    def _check_ckpt_path(self) -> None:
        # A checkpoint that does not fit the data or the model fails here with what differs, before anything runs.
        ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
        if _is_checkpoint(ckpt_path):
            checkpoint = self._read_checkpoint(ckpt_path)
            check_checkpoint(checkpoint, ckpt_path, self.trusted)  # make resume finds its checkpoint after parsing
            state = checkpoint.get(type(self.datamodule).__qualname__)  # where Lightning saves the DataModule's
            if state is not None and isinstance(self.datamodule, ResumableDataModule):
                check_resume_position(state, ckpt_path)
                self.datamodule.check_checkpoint_state(state)
            if "state_dict" in checkpoint:  # a folder's weights are its shards: torch's reader compares their sizes
                check_fits(checkpoint, self.model, ckpt_path, self._fits_fix())

    def _hand_over_checkpoint(self) -> None:
        # Checked: the copy read once goes to the checkpoint plugin, which hands it to Lightning's restore
        # instead of a second read and then lets it go; it is not held for the whole run here. Only where
        # the strategy restores through the plugin (single device, DDP): FSDP and DeepSpeed read shards
        # themselves, and a copy never taken would stay in memory for the whole run.
        ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
        strategy = self.trainer.strategy
        through_plugin = type(strategy).load_checkpoint is Strategy.load_checkpoint
        checkpoint_io = strategy.checkpoint_io if through_plugin else None
        read = (self._checkpoints or {}).get(ckpt_path)
        self._checkpoints = None
        if read is not None and "state_dict" not in read and through_plugin:  # a folder: a file was expected
            raise CheckpointError(
                f"{ckpt_path}: a distributed checkpoint (a folder of shards) resumes under the fsdp2 preset; for "
                f"another strategy gather it into one file first: python -m {__package__}.sharding {ckpt_path}"
            )
        if read is not None and isinstance(checkpoint_io, AtomicCheckpointIO):
            checkpoint_io.hand_over(ckpt_path, read)

    def _fits_fix(self) -> str:
        if self.resumed_with is None:
            return FITS_FIX
        config, model_args = self.resumed_with
        return (
            f"--resume=true continues the run with its own config ({config}); the arguments given on top of it "
            f"({' '.join(model_args)}) change the model it trained: leave them out, or start "
            "a new run (no --resume)"
        )

    def before_validate(self) -> None:
        self._check_ckpt_path()
        self._hand_over_checkpoint()

    def before_test(self) -> None:
        self._check_ckpt_path()
        self._hand_over_checkpoint()

    def before_predict(self) -> None:
        self._check_ckpt_path()
        self._hand_over_checkpoint()
        silence_predict_warnings()

    def before_fit(self) -> None:
        self._check_ckpt_path()
        if self.trainer.is_global_zero:
            replace_srun_hint()
        ckpt_path = self.config_init.fit.get("ckpt_path")
        if _is_checkpoint(ckpt_path):  # fit continues the optimizer and schedule too
            checkpoint = self._read_checkpoint(ckpt_path)
            check_optimizer_continues(checkpoint, self.model, ckpt_path)
            built = self.model.build_optimizer(total_steps=1000) if isinstance(self.model, TrainingModule) else None
            check_training_state(checkpoint, self.trainer, ckpt_path, built)
        self._hand_over_checkpoint()
        if ckpt_path and self.trainer.is_global_zero:
            replace_resume_warnings(str(run_dir(self.trainer)))
        announce_run(self.trainer)
        keep_csv_metrics(self.trainer)
        profile_into_run_dir(self.trainer)

    def after_fit(self) -> None:
        if self.config.fit.test_after_fit and not self.trainer.interrupted:
            evaluate_best_checkpoint(self.trainer, self.model, self.datamodule)
        report_profiler_files(self.trainer)


def _option_keys(parser) -> list[str]:
    """Every option key of ``parser`` and its subcommands' parsers (``trainer.max_epochs``, ...)."""
    keys = []
    for action in parser._actions:
        if isinstance(action.choices, dict):  # the subcommands: a parser each
            keys += [key for sub in action.choices.values() if hasattr(sub, "_actions") for key in _option_keys(sub)]
        elif action.dest and action.dest != "help":
            keys.append(action.dest)
    return keys


def _is_checkpoint_file(ckpt_path: str | None) -> bool:
    # A sharded (FSDP) checkpoint is a folder: its arguments are not read into the config (its states are checked).
    return _is_checkpoint(ckpt_path) and not Path(ckpt_path).is_dir()


def _is_checkpoint(ckpt_path: str | None) -> bool:
    # A path, file or distributed checkpoint's folder, not Lightning's "last" or "best".
    return bool(ckpt_path) and ckpt_path not in _NAMED_CHECKPOINTS


def run_cli(cli_class: type[TrainingCLI], args: list[str] | None = None, run: bool = True) -> TrainingCLI:
    """Run ``cli_class`` (the task's ``cli.CLI``) on ``args`` (default: ``sys.argv[1:]``) and return it.

    A user error (:class:`engine.errors.UserError`: a config, data, checkpoint or launch mistake)
    prints one line ``error: ...`` and exits 2; jsonargparse does the same for unknown options and
    wrong types. Any other exception is a bug and keeps its traceback.

    With ``run=False`` there is no subcommand: the CLI only parses ``args`` and builds the
    Trainer, model and DataModule (``cli.trainer``, ``cli.model``, ``cli.datamodule``).
    """
    silence_dependency_noise()
    silence_srun_hint()  # said by every Trainer as it is built; fit says it once in our words (before_fit)
    with exit_on_user_error():
        check_config_files(sys.argv[1:] if args is None else args)
        return cli_class(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=SaveConfigToRunDir,
            parser_class=Parser,
            # A mistyped option must fail, not silently match a longer one (max_epoch for max_epochs).
            parser_kwargs={"allow_abbrev": False, "prog": f"python -m {PROJECT_PACKAGE}"},
            args=args,
            run=run,
        )
