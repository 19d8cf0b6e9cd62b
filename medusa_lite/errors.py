"""Exceptions with messages that name the problem.

Every error medusa-lite raises on purpose derives from ``MedusaError`` and from the builtin
exception a caller would naturally catch (``ValueError``, ``FileNotFoundError``...), so both
``except MedusaError`` and ``except ValueError`` work.
"""


class MedusaError(Exception):
    """Base class of all errors raised on purpose by medusa-lite."""


class IncompatibleHeadsError(MedusaError, ValueError):
    """Heads were trained for a model with another hidden size or vocabulary."""


class HeadsConfigError(MedusaError, ValueError):
    """A ``MedusaConfig`` value is invalid (wrong type, out of range, a malformed ``training_summary``)."""


class HeadsFileError(MedusaError, ValueError):
    """A heads folder is missing a file, or a file is truncated, corrupt or malformed."""


class DraftVocabError(MedusaError, ValueError):
    """A draft vocabulary's token ids are out of range, repeated, or do not fit the heads."""


class TreeError(MedusaError, ValueError):
    """A candidate tree is malformed or does not fit the heads."""


class GenerationInputError(MedusaError, ValueError):
    """An argument to ``generate`` is invalid (prompt, sampling settings, limits)."""


class UnsupportedModelError(MedusaError, ValueError):
    """The target model cannot be verified with a tree attention mask."""


class ArtifactNotFoundError(MedusaError, FileNotFoundError):
    """A local folder does not exist, or a Hub repo (or a file in it) cannot be had."""


class AdapterError(MedusaError, ValueError):
    """An artifact's backbone adapter (Medusa-2's LoRA) is missing, malformed or does not fit the model."""


class ExportError(MedusaError, ValueError):
    """A drafter cannot be written in (or read from) a serving engine's format: the message names what does not fit."""
