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

from medusa_lite.training.errors import CheckpointError

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


COUNTS_IN_STATE = ("step", "tokens_trained")  # what a resumed run continues from
RANDOM_STATES_GLOB = "random_states_*.pkl"  # accelerate's per-process random states (loaded weights_only)
CORRUPT_ADVICE = (
    "the checkpoint is corrupt: delete its folder to resume from the one before it, or train again without --resume"
)


def read_state(folder: Path) -> dict:
    """The trainer state a checkpoint folder holds: a JSON object whose ``step`` is the folder's and whose
    ``tokens_trained`` is a count; anything else a :class:`CheckpointError` naming the file."""
    path = folder / STATE_NAME
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path} cannot be read as JSON ({type(error).__name__}: {error})") from error
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} must hold a JSON object, got {type(state).__name__}")
    for name in COUNTS_IN_STATE:
        value = state.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{path}: {name} must be a count (an integer >= 0), got {value!r}")
    match = STEP_PATTERN.match(folder.name)
    if match and int(match.group(1)) != state["step"]:
        raise CheckpointError(f"{path}: step {state['step']} in the file, but the folder is step {match.group(1)}")
    return state


def check_readable_files(folder: Path) -> None:
    """Open every file of a checkpoint that accelerate would read without naming it in its errors (the weights'
    safetensors headers, the random states): a corrupt one is a :class:`CheckpointError` naming it, before
    anything is restored. accelerate itself would skip unreadable random states with an info-level log,
    silently giving a resumed run other random draws than the uninterrupted one."""
    from accelerate.utils import load as accelerate_load  # weights_only, with accelerate's allowed numpy types
    from safetensors import safe_open

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt") as weights:
                weights.keys()
        except Exception as error:  # safetensors raises its own error types for a malformed header
            raise CheckpointError(f"{path} is not a readable safetensors file ({error}); {CORRUPT_ADVICE}") from error
    for path in sorted(folder.glob(RANDOM_STATES_GLOB)):
        try:
            states = accelerate_load(path)
        except Exception as error:  # torch.load's errors for a truncated or tampered file vary by version
            raise CheckpointError(f"{path} cannot be loaded ({type(error).__name__}); {CORRUPT_ADVICE}") from error
        if not isinstance(states, dict) or "torch_manual_seed" not in states:
            raise CheckpointError(f"{path} holds no random states; {CORRUPT_ADVICE}")
