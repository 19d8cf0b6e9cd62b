"""Where medusa-lite keeps files between runs: the converted default model, built kernels, measured step costs.

The root is ``~/.cache/medusa-lite``; the environment variable ``MEDUSA_LITE_CACHE`` replaces it.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV_VAR = "MEDUSA_LITE_CACHE"
DEFAULT_CACHE_ROOT = Path("~/.cache/medusa-lite")


def cache_root() -> Path:
    """Root of medusa-lite's cache: ``$MEDUSA_LITE_CACHE`` if set, else ``~/.cache/medusa-lite``."""
    override = os.environ.get(CACHE_ENV_VAR)
    root = Path(override) if override else DEFAULT_CACHE_ROOT
    return root.expanduser()
