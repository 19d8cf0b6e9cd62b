"""Optional dependencies: which extra of ``medusa-lite`` installs each, and the error when one is missing.

Decoding needs only the core dependencies (torch, transformers, safetensors, huggingface_hub).
Every package below is imported only by the feature that needs it, after ``require_extra``.
"""

from __future__ import annotations

import importlib

from medusa_lite.errors import MedusaError

PACKAGE_NAME = "medusa-lite"
EXTRA_OF_PACKAGE = {
    "peft": "train",
    "accelerate": "train",
    "datasets": "train",
    "deepspeed": "train",
    "wandb": "train",
    "matplotlib": "bench",
    "gguf": "gguf",
}


class MissingExtraError(MedusaError, ImportError):
    """A feature needs an optional package that is not installed."""


def install_command(package: str) -> str:
    """The pip command that installs the extra providing ``package``."""
    return f"pip install '{PACKAGE_NAME}[{EXTRA_OF_PACKAGE[package]}]'"


def require_extra(package: str, feature: str) -> None:
    """Import ``package`` or raise ``MissingExtraError`` naming ``feature`` and the extra to install."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as error:
        if error.name != package:  # the package is there but one of its own dependencies is not
            raise
        raise MissingExtraError(
            f"{feature} needs the '{package}' package, which is not installed: {install_command(package)}"
        ) from error
