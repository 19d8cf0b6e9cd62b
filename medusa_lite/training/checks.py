"""Checks run before any real work: each failure names the problem and the fix.

Every rank runs the same checks on the same inputs, so all ranks fail together (none waits
forever on the others).
"""

from __future__ import annotations

import datetime
import importlib.util
import netrc
import os
import shutil
from pathlib import Path
from typing import IO

try:
    import fcntl  # POSIX: the run lock (elsewhere two runs into one output_dir are not detected)
except ImportError:  # pragma: no cover - Windows
    fcntl = None

import torch

from medusa_lite.extras import install_command, require_extra
from medusa_lite.training import checkpoint as ckpt
from medusa_lite.training.config import GIGABYTE, TrainConfig
from medusa_lite.training.errors import OutputDirError, TrackerError, TrainingConfigError

HEADS_DIR = "heads"
FREE_SPACE_MARGIN = 1.2
ADAM_STATE_COPIES = 3  # weights + two moments, float32
OFFLINE_WANDB_MODES = ("offline", "disabled", "dryrun")
RUN_LOCK_NAME = ".medusa-lite-training.lock"  # held by a run's main process while it trains into output_dir


def wandb_key_available() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    netrc_path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return netrc.netrc(str(netrc_path)).authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def check_tracker(config: TrainConfig) -> None:
    if config.wandb is None:
        return
    if importlib.util.find_spec("wandb") is None:
        raise TrackerError(
            "a wandb section is configured but the wandb package is not installed (" + install_command("wandb") + ")"
        )
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode not in OFFLINE_WANDB_MODES and not wandb_key_available():
        raise TrackerError(
            f"wandb is configured (wandb.project = {config.wandb.project!r}) but no API key was found "
            "(WANDB_API_KEY or ~/.netrc) "
            "and WANDB_MODE is not offline: run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline "
            "to log locally (sync later with `wandb sync`)"
        )


def check_output_dir(output_dir: Path, resume: bool, overwrite: bool) -> None:
    """Writable, and not holding another run that a fresh start would clobber."""
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{os.getpid()}"
        with open(probe, "wb") as handle:
            handle.write(b"medusa-lite")
            handle.flush()
            os.fsync(handle.fileno())
        probe.unlink()
    except OSError as error:
        raise OutputDirError(
            f"output_dir {output_dir} is not writable ({type(error).__name__}: {error}); choose another output_dir"
        ) from error
    if resume or overwrite:
        return
    previous = ckpt.complete_checkpoints(output_dir / ckpt.CHECKPOINTS_DIR)
    if previous or (output_dir / HEADS_DIR / "config.json").exists():
        raise OutputDirError(
            f"output_dir {output_dir} already holds a training run ({len(previous)} checkpoint(s), heads: "
            f"{(output_dir / HEADS_DIR).exists()}); pass --resume to continue it, --overwrite_output_dir "
            "true to start over, "
            "or choose another output_dir"
        )


def take_run_lock(output_dir: Path) -> tuple[IO | None, str | None]:
    """(the open lock file, None), or (None, what holds it): an exclusive ``flock`` on ``output_dir``'s run lock,
    which the system releases when the holder ends in any way (kill -9 included), so a dead run never blocks."""
    if fcntl is None:
        return None, None
    handle = open(output_dir / RUN_LOCK_NAME, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that wrote nothing yet"
        handle.close()
        return None, (
            f"output_dir {output_dir} is in use by another training run ({holder}; {RUN_LOCK_NAME}): two runs "
            "writing one folder would overwrite each other's checkpoints; wait for it to end (then --resume "
            "continues it), or choose another output_dir"
        )
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, started {datetime.datetime.now().isoformat(timespec='seconds')}\n")
    handle.flush()
    return handle, None


def hold_run_lock(output_dir: Path, accelerator) -> IO | None:
    """The main process takes ``output_dir``'s run lock (:func:`take_run_lock`) and tells every rank whether it got
    it, so all ranks refuse together with an :class:`OutputDirError` when another run holds it. Close the returned
    file when the run ends."""
    handle, problem = take_run_lock(output_dir) if accelerator.is_main_process else (None, None)
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        problem = broadcast_object_list([problem])[0]
    if problem is not None:
        raise OutputDirError(problem)
    return handle


def check_free_space(output_dir: Path, needed_bytes: int) -> None:
    free = shutil.disk_usage(output_dir).free
    if free < needed_bytes * FREE_SPACE_MARGIN:
        raise OutputDirError(
            f"output_dir {output_dir} has {free / GIGABYTE:.3g} GB free but training will write about "
            f"{needed_bytes / GIGABYTE:.3g} GB (checkpoints, heads, hidden-state cache); free some space, lower "
            "keep_checkpoints or max_length, or choose another output_dir"
        )


def estimate_output_bytes(config: TrainConfig, objective: torch.nn.Module, cache_bytes: int) -> int:
    trainable = sum(p.numel() for p in objective.parameters() if p.requires_grad)
    frozen_saved = sum(p.numel() * p.element_size() for p in objective.parameters() if not p.requires_grad)
    per_checkpoint = trainable * 4 * ADAM_STATE_COPIES + frozen_saved
    return per_checkpoint * (config.keep_checkpoints + 1) + trainable * 4 + cache_bytes


def check_processes_connected(accelerator) -> None:
    """Several processes that accelerate does not synchronise would train independent copies."""
    require_extra("accelerate", "Training heads")
    from accelerate.utils import DistributedType

    if accelerator.num_processes > 1 and accelerator.distributed_type == DistributedType.NO:
        raise TrainingConfigError(
            f"accelerate started {accelerator.num_processes} processes but does not synchronise them "
            "(distributed_type NO): "
            "each would train its own copy of the heads. On CPU launch with "
            "`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes N --num_machines 1 ...` "
            "(or --config_file configs/accelerate_cpu_2proc.yaml with ACCELERATE_USE_CPU=true)"
        )
