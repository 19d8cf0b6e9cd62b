"""Where medusa-lite keeps files between runs: the converted default model, built kernels, measured step costs.

The root is ``~/.cache/medusa-lite``; the environment variable ``MEDUSA_LITE_CACHE`` replaces it.
Every entry is written to a temporary name beside it and renamed into place, so two processes
sharing the cache never read a half-written entry. A root that cannot hold an entry (a file, a
read-only or uncreatable folder) does not stop a run: :func:`writable_entry` warns once, naming
``MEDUSA_LITE_CACHE``, and puts the entry in a temporary folder of this process instead (so the
default model is converted and kernels built again each run until the root is fixed). Within one process,
threads that need one missing entry at once take turns on :func:`entry_lock`: one measures it, the rest read it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

CACHE_ENV_VAR = "MEDUSA_LITE_CACHE"
DEFAULT_CACHE_ROOT = Path("~/.cache/medusa-lite")
ENTRY_LOCKS: dict[Path, threading.Lock] = {}  # one per cache entry this process has asked for
ENTRY_LOCKS_GUARD = threading.Lock()


def cache_root() -> Path:
    """Root of medusa-lite's cache: ``$MEDUSA_LITE_CACHE`` if set, else ``~/.cache/medusa-lite``."""
    override = os.environ.get(CACHE_ENV_VAR)
    root = Path(override) if override else DEFAULT_CACHE_ROOT
    return root.expanduser()


def unwritable_reason(folder: Path) -> str | None:
    """Why an entry cannot be written into ``folder`` (created if missing); None when it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    return None


@functools.cache
def process_cache_root() -> Path:
    """A temporary cache root for this process alone, removed when it exits."""
    root = Path(tempfile.mkdtemp(prefix="medusa-lite-cache-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def warn_unusable_root(root: Path, reason: str) -> None:
    where = f"{CACHE_ENV_VAR}={root}" if os.environ.get(CACHE_ENV_VAR) else f"the cache folder {root}"
    warnings.warn(
        f"medusa-lite cannot write its cache into {where} ({reason}); this run uses a temporary folder "
        f"instead. Point {CACHE_ENV_VAR} at a writable folder to keep the converted model, kernels and costs.",
        stacklevel=3,
    )


def writable_entry(path: Path) -> Path:
    """Where to write the cache entry ``path`` (under :func:`cache_root`): ``path`` itself when its folder can
    hold it, else the same entry under :func:`process_cache_root` (with a warning naming the root)."""
    root = cache_root()
    reason = unwritable_reason(path.parent)
    if reason is None:
        return path
    warn_unusable_root(root, reason)
    fallback = process_cache_root() / path.relative_to(root)
    fallback.parent.mkdir(parents=True, exist_ok=True)
    return fallback


def existing_entry(path: Path) -> Path:
    """The cache entry ``path``, or this process's fallback copy of it when only that exists (see
    :func:`writable_entry`); ``path`` when neither does."""
    if path.exists() or process_cache_root.cache_info().currsize == 0:
        return path
    fallback = process_cache_root() / path.relative_to(cache_root())
    return fallback if fallback.exists() else path


def entry_lock(path: Path) -> threading.Lock:
    """This process's lock for the cache entry ``path``: a thread that finds the entry missing measures it under
    the lock after reading it again, so requests arriving together wait for one measurement instead of each
    timing the machine while the others load it."""
    with ENTRY_LOCKS_GUARD:
        return ENTRY_LOCKS.setdefault(path, threading.Lock())
