"""Dependency messages a run does not need, switched off where the dependency allows it.

Only messages that are noise for every user are dropped, each named with its source; warnings
about the user's own setup (and everything our code says) still reach the terminal.
"""

import logging
import warnings

# lightning 2.6 (lightning/pytorch/utilities/_pytree.py) on torch >= 2.10 warns on every run that
# torch.utils._pytree.LeafSpec is deprecated: a note to Lightning's developers, not to a user.
LEAFSPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
# lightning 2.6 (trainer/connectors/logger_connector) advertises its hosted LitLogger on every run.
LITLOGGER_TIP = "Tip: For seamless cloud logging"


class _DropLitLoggerTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return LITLOGGER_TIP not in record.getMessage()


def silence_dependency_noise() -> None:
    """Filter the messages above; safe to call more than once."""
    warnings.filterwarnings("ignore", message=LEAFSPEC, category=FutureWarning)
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(existing, _DropLitLoggerTip) for existing in logger.filters):
        logger.addFilter(_DropLitLoggerTip())
