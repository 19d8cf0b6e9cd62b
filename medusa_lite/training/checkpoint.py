"""Checkpoints that are either complete or invisible.

A checkpoint is written into ``checkpoints/.tmp-step-XXXXXXXX`` (accelerate's ``save_state``:
trainable weights, optimizer, every rank's RNG; plus ``trainer_state.json`` with the
step and data position), every file is fsynced, a ``COMPLETE`` marker is written, and only then is
the folder renamed to ``checkpoints/step-XXXXXXXX`` (an atomic rename on one filesystem). A run
killed at any moment therefore leaves either a complete checkpoint or a ``.tmp-`` folder, which
resuming ignores (and removes). The last ``keep`` complete checkpoints are kept.

Debugging aid: with ``MEDUSA_LITE_DEBUG_STALL_CHECKPOINT=<step>:<seconds>`` in the environment the
main process sleeps that long in the middle of writing that step's checkpoint (the trainable
state saved, the step file and ``COMPLETE`` not yet), after saying so on stderr, so that a test
can kill it mid-write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "step-"
TEMP_PREFIX = ".tmp-"
COMPLETE_MARKER = "COMPLETE"
STATE_NAME = "trainer_state.json"
STEP_PATTERN = re.compile(r"^step-(\d{8})$")
DEBUG_STALL_ENV = "MEDUSA_LITE_DEBUG_STALL_CHECKPOINT"


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file() and (path / STATE_NAME).is_file()


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_PATTERN.match(entry.name)
        if match and entry.is_dir() and is_complete(entry):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def incomplete_entries(root: Path) -> list[Path]:
    """Leftovers of interrupted writes: ``.tmp-*`` folders and step folders without the marker."""
    if not root.is_dir():
        return []
    return sorted(
        e
        for e in root.iterdir()
        if e.name.startswith(TEMP_PREFIX) or (STEP_PATTERN.match(e.name) and not is_complete(e))
    )


def latest_complete(root: Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    for directory, _, files in os.walk(folder):
        for name in files:
            fsync_path(Path(directory) / name)
        fsync_path(Path(directory))


def remove_incomplete(root: Path) -> list[Path]:
    removed = incomplete_entries(root)
    for entry in removed:
        shutil.rmtree(entry, ignore_errors=True)
    return removed


def prune(root: Path, keep: int) -> None:
    for _, folder in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(folder, ignore_errors=True)


def debug_stall_mid_write(step: int, temp: Path) -> None:
    """Sleep inside this checkpoint's write when ``DEBUG_STALL_ENV`` names its step (see the module docstring)."""
    value = os.environ.get(DEBUG_STALL_ENV)
    if not value:
        return
    stall_step, _, seconds = value.partition(":")
    if int(stall_step) == step:
        print(f"debug: stalling {seconds} s in the middle of writing {temp}", file=sys.stderr, flush=True)
        time.sleep(float(seconds))


def save_checkpoint(accelerator, root: Path, step: int, state: dict, keep: int, **save_kwargs) -> Path:
    """Collective: every rank calls it. Returns the final folder."""
    final = root / step_dir_name(step)
    temp = root / (TEMP_PREFIX + step_dir_name(step))
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(temp), **save_kwargs)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        debug_stall_mid_write(step, temp)
        (temp / STATE_NAME).write_text(json.dumps(state, indent=2))
        fsync_tree(temp)
        marker = temp / COMPLETE_MARKER
        marker.write_text(f"step {step}\n")
        fsync_path(marker)
        fsync_path(temp)
        if final.exists():
            shutil.rmtree(final)
        os.rename(temp, final)
        fsync_path(root)
        prune(root, keep)
    accelerator.wait_for_everyone()
    return final


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE_NAME).read_text())
