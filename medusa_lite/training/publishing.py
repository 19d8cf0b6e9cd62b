"""Publishing a run's drafter: written through its kind's artifact class (atomically, checked to load
strictly), the ranks' weights checked to agree, and pushed to the Hub on request."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from pathlib import Path

import torch

from medusa_lite.artifacts.files import ADAPTER_DIR
from medusa_lite.drafters.hydra.heads import HydraConfig
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.registry import kind_of
from medusa_lite.drafters.sequential.drafter import DrafterConfig
from medusa_lite.training import checkpoint as ckpt
from medusa_lite.training.checks import HEADS_DIR
from medusa_lite.training.run import Run, RunLog
from medusa_lite.training.setup import is_zero3


def write_heads(
    heads_config: MedusaConfig | DrafterConfig | HydraConfig, state: dict, heads_dir: Path, adapter_model=None
) -> None:
    """Save heads (or a drafter) atomically (temp folder, then rename) and check they load strictly.

    ``adapter_model`` (Medusa-2: the peft model whose adapter was trained) saves its adapter into
    the heads folder's ``adapter/`` (the layout of :mod:`medusa_lite.artifacts.files`).
    """
    module_class = kind_of(heads_config).artifact
    heads = module_class(heads_config)
    heads.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    )  # draft ids stay integers
    temp = heads_dir.with_name(f".tmp-{heads_dir.name}")
    shutil.rmtree(temp, ignore_errors=True)
    heads.save_pretrained(temp)
    if adapter_model is not None:
        adapter_model.save_pretrained(str(temp / ADAPTER_DIR))
    ckpt.fsync_tree(temp)
    previous = heads_dir.with_name(f".old-{heads_dir.name}")
    if heads_dir.exists():  # a previous run's heads stay in place until the new ones are complete
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(heads_dir, previous)
    os.rename(temp, heads_dir)
    shutil.rmtree(previous, ignore_errors=True)
    module_class.from_pretrained(heads_dir)


def heads_state(full_state: dict) -> dict:
    prefix = "heads."
    return {k[len(prefix) :]: v for k, v in full_state.items() if k.startswith(prefix)}


def weights_digest(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, parameter in sorted(module.named_parameters()):
        if parameter.requires_grad:
            digest.update(name.encode())
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def gather_digests(accelerator, module) -> list[str]:
    """Every rank's digest of its trainable weights (straight from torch.distributed, so that
    unsynchronised processes cannot hide behind a no-op gather)."""
    digest = weights_digest(module)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [digest]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, digest)
    return gathered


def save_results(run: Run, summary: dict, output_dir: Path) -> tuple[Path, Path | None]:
    """Final heads (and adapter, in the heads folder); checks on the way that all ranks hold the same weights."""
    accelerator, log = run.accelerator, run.log
    heads_dir, adapter_dir = output_dir / HEADS_DIR, None
    full_state = accelerator.get_state_dict(run.objective)  # collective under ZeRO-3
    unwrapped = accelerator.unwrap_model(run.objective)
    if not is_zero3(accelerator):
        digests = gather_digests(accelerator, unwrapped)
        summary["ranks_in_sync"] = len(set(digests)) == 1
        log.say(
            f"trainable weights sha256 per rank: {digests} "
            f"({'in sync' if summary['ranks_in_sync'] else 'NOT IN SYNC'})"
        )
    if accelerator.is_main_process:
        adapter = {"backbone_adapter": True} if run.medusa2 else {}  # Medusa-2 trains Medusa heads only
        heads_config = dataclasses.replace(run.heads.config, training_summary=summary, **adapter)
        write_heads(heads_config, heads_state(full_state), heads_dir, unwrapped.model if run.medusa2 else None)
        log.say(f"saved heads to {heads_dir}")
        if run.medusa2:
            adapter_dir = heads_dir / ADAPTER_DIR
            log.say(f"saved the LoRA adapter to {adapter_dir} (load(model, heads={str(heads_dir)!r}) applies it)")
    accelerator.wait_for_everyone()
    return heads_dir, adapter_dir


def push(heads_dir: Path, repo_id: str, log: RunLog) -> str | None:
    """Upload the saved heads; a failure is reported, never raised (the heads stay on disk)."""
    try:
        from medusa_lite.artifacts.hub import push_heads_to_hub

        url = push_heads_to_hub(str(heads_dir), repo_id, token=None, private=False)
        log.say(f"pushed heads to {repo_id}: {url}")
        return None
    except Exception as error:  # network, auth, missing module: keep the saved heads either way
        message = (
            f"push to the Hub ({repo_id}) failed: {type(error).__name__}: {error}. The heads are saved in "
            f"{heads_dir}; push them later with medusa_lite.artifacts.hub.push_heads_to_hub({str(heads_dir)!r}, "
            f"{repo_id!r})"
        )
        log.say(message)
        return message
