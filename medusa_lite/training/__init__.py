"""Head training for medusa-lite (``train/train_heads.py`` is the command-line entry point).

Modules: ``config`` (the YAML config), ``data`` (datasets + chat-template masking), ``losses``
(targets, CE/KL, accuracy), ``objective`` (what ``accelerator.prepare`` gets), ``hidden_cache``
(precomputed hidden states), ``checkpoint`` (atomic checkpoints), ``batches``, ``trainer`` (the run:
accelerator, optimizer, steps), ``reporting`` (evaluation, metrics, summary), ``publishing`` (save, push),
``artifacts`` (loading the results), ``errors``.
"""

from medusa_lite.training.artifacts import load_trained
from medusa_lite.training.config import LoraSettings, TrainConfig, WandbSettings, load_config
from medusa_lite.training.errors import (
    EmptyDatasetError,
    HiddenCacheError,
    MissingChatTemplateError,
    NoAssistantTurnError,
    NonFiniteLossError,
    OutputDirError,
    TrackerError,
    TrainingConfigError,
    TrainingDataError,
)

__all__ = [
    "EmptyDatasetError",
    "HiddenCacheError",
    "LoraSettings",
    "MissingChatTemplateError",
    "NoAssistantTurnError",
    "NonFiniteLossError",
    "OutputDirError",
    "TrackerError",
    "TrainConfig",
    "TrainingConfigError",
    "TrainingDataError",
    "WandbSettings",
    "load_config",
    "load_trained",
]
