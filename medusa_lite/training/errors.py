"""Errors raised on purpose by head training; each message names the problem and what to do.

Like :mod:`medusa_lite.errors`, every class derives from ``MedusaError`` and from the builtin
exception a caller would naturally catch.
"""

from medusa_lite.errors import MedusaError


class TrainingConfigError(MedusaError, ValueError):
    """A training config is invalid: unknown key (typo), wrong type, impossible combination."""


class TrainingDataError(MedusaError, ValueError):
    """The training data cannot be used as given."""


class EmptyDatasetError(TrainingDataError):
    """The data file holds no records (or none left after filtering)."""


class NoAssistantTurnError(TrainingDataError):
    """No conversation in the data has an assistant turn to train on."""


class MissingChatTemplateError(TrainingDataError):
    """Conversations were given but the tokenizer has no chat template to render them."""


class HiddenCacheError(MedusaError, ValueError):
    """The hidden-state cache would be too large, or an existing one does not match."""


class OutputDirError(MedusaError, OSError):
    """The output folder is not writable or lacks the free space training will need."""


class NonFiniteLossError(MedusaError, FloatingPointError):
    """The loss became NaN or infinite; training stopped before updating any weight with it."""


class TrackerError(MedusaError, RuntimeError):
    """Experiment tracking (wandb) is configured but cannot start."""


class CheckpointError(MedusaError, ValueError):
    """A checkpoint that ``--resume`` will not load (e.g. it holds a pickle that loading would run)."""
