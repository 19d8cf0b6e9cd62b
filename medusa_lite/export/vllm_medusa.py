"""Medusa heads in the layout vLLM's Medusa loader reads, and back.

vLLM (``vllm/model_executor/models/medusa.py``, config ``vllm/transformers_utils/configs/medusa.py``)
builds ``num_speculative_tokens`` heads, each a stack of residual blocks ``x + SiLU(W x + b)``
(``blocks.{i}.layers.{j}``; the bias when ``medusa_fc_bias``) reading the target's last hidden state,
then a projection: one per head (``lm_heads.{i}``) or, with ``original_lm_head``, one shared
``lm_head``. A truncated vocabulary is ``truncated_vocab_size`` rows of that shared head chosen by
``token_map`` (draft index -> target id; vLLM takes the rows from the full matrix and scatters the
logits back, every other token -inf). Head i guesses the token i + 2 after the hidden state's
position, as medusa-lite's head i does. vLLM's loader refuses a checkpoint missing any tensor
it builds, and renames every config key holding "num" and "heads"/"layers", so the config is
written whole and holds nothing of the target's.

What the format cannot hold is refused by name: heads that read the next token
(``next_token_input``), a target whose lm_head has a bias, and the other drafter kinds.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.errors import ExportError, MedusaError

FORMAT = "vllm"
MODEL_TYPE = "medusa"
ARCHITECTURE = "MedusaModel"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKEN_MAP = "token_map"
SHARED_LM_HEAD = "lm_head.weight"


def block_name(head: int, layer: int, what: str) -> str:
    return f"blocks.{head}.layers.{layer}.{what}"


def lm_head_name(head: int) -> str:
    return f"lm_heads.{head}.weight"


def check_expressible(heads: object, target_lm_head: nn.Module) -> MedusaHeads:
    """``heads`` if vLLM's Medusa format can hold them with this target, else :class:`ExportError` naming why."""
    if not isinstance(heads, MedusaHeads):
        raise ExportError(
            f"vLLM's Medusa format holds Medusa heads only, not a {type(heads).__name__}: each head there reads "
            "the target's last hidden state alone"
        )
    if heads.config.next_token_input:
        raise ExportError(
            "these heads read the next token too (next_token_input: true), which vLLM's Medusa heads cannot: "
            "train heads for vLLM with next_token_input: false "
            "(medusa-lite train --config ... --next_token_input false)"
        )
    if heads.config.backbone_adapter:
        raise ExportError(
            "these heads were trained with a LoRA adapter on the target (Medusa-2) and guess for the adapted "
            "model only: vLLM would serve them on the plain target"
        )
    if getattr(target_lm_head, "bias", None) is not None:
        raise ExportError("the target's lm_head has a bias, which vLLM's Medusa lm_head does not hold")
    return heads


def vllm_config(config: MedusaConfig, token_map: bool = False) -> dict:
    """config.json as vLLM's ``MedusaConfig`` reads it: every size written, nothing of the target's."""
    draft_vocab = config.draft_vocab_size if token_map else None
    return {
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "truncated_vocab_size": config.vocab_size if draft_vocab is None else draft_vocab,
        "medusa_fc_bias": True,  # medusa-lite's residual blocks have a bias
        "original_lm_head": config.use_base_lm_head,
        "base_model_name_or_path": config.base_model_name_or_path,
    }


def vllm_tensors(heads: MedusaHeads, target_lm_head: nn.Module, token_map: bool = False) -> dict[str, torch.Tensor]:
    """The tensors vLLM's Medusa model loads, named as it names them (contiguous copies, the heads' dtype)."""
    tensors = {}
    for i, head in enumerate(heads.heads):
        for j, block in enumerate(head.blocks):
            tensors[block_name(i, j, "weight")] = block.linear.weight
            tensors[block_name(i, j, "bias")] = block.linear.bias
        if head.lm_head is not None:
            tensors[lm_head_name(i)] = head.lm_head.weight
    if heads.config.use_base_lm_head:
        tensors[SHARED_LM_HEAD] = target_lm_head.weight.to(heads.heads[0].blocks[0].linear.weight.dtype)
    if token_map and heads.draft_token_ids is not None:
        tensors[TOKEN_MAP] = heads.draft_token_ids.to(torch.int64)
    return {name: tensor.detach().contiguous().clone() for name, tensor in tensors.items()}


def speculative_config(folder: str | Path, num_heads: int) -> dict:
    """What to pass as ``vllm.LLM(..., speculative_config=...)`` (or ``--speculative-config`` as JSON)."""
    return {"method": MODEL_TYPE, "model": str(folder), "num_speculative_tokens": num_heads}


def export_heads(
    heads: object, target_lm_head: nn.Module, out: str | Path, *, target: str | None = None, token_map: bool = False
) -> dict:
    """Write ``heads`` into ``out`` for vLLM (config.json, model.safetensors, export.json); returns export.json.

    Heads with a draft vocabulary: by default vLLM's heads guess among the whole vocabulary (the
    shared lm_head in full). ``token_map=True`` writes vLLM's truncated-vocabulary layout instead
    (``truncated_vocab_size`` + ``token_map``: the same guesses as medusa-lite's), which vLLM 0.32's
    own weight check refuses ("Following weights were not initialized from checkpoint: {'token_map'}":
    its loader never reports the token map as loaded).
    """
    heads = check_expressible(heads, target_lm_head)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_FILE).write_text(json.dumps(vllm_config(heads.config, token_map), indent=2) + "\n")
    save_file(vllm_tensors(heads, target_lm_head, token_map), out / WEIGHTS_FILE, metadata={"format": "pt"})
    restricted = token_map and heads.config.draft_vocab_size is not None
    record = {
        "format": FORMAT,
        "kind": "medusa_heads",
        "target": target or heads.config.base_model_name_or_path,
        "speculative_config": speculative_config(out.resolve(), heads.config.num_heads),
        "guesses_among": f"{heads.config.draft_vocab_size} draft-vocabulary tokens (token_map)"
        if restricted
        else "the whole vocabulary",
        "notes": "vLLM proposes a chain: head i's top-1 guess at depth i + 1 (no tree)",
    }
    (out / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


REQUIRED_KEYS = ("hidden_size", "vocab_size", "num_heads", "num_hidden_layers")


def read_vllm_config(path: Path) -> dict:
    """A vLLM Medusa config.json, or :class:`ExportError` naming the file and what is wrong with it."""
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as error:
        raise ExportError(
            f"{path} does not exist: a vLLM Medusa folder holds config.json and model.safetensors"
        ) from error
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path} cannot be read as JSON ({type(error).__name__}: {error})") from error
    if not isinstance(config, dict) or config.get("model_type") != MODEL_TYPE:
        found = config.get("model_type") if isinstance(config, dict) else type(config).__name__
        raise ExportError(f"{path} is not a vLLM Medusa config (model_type {found!r}, expected {MODEL_TYPE!r})")
    missing = [key for key in REQUIRED_KEYS if not isinstance(config.get(key), int) or isinstance(config[key], bool)]
    if missing:
        raise ExportError(f"{path} lacks an integer {', '.join(missing)}")
    return config


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, or :class:`ExportError` naming it."""
    try:
        return load_file(path)
    except FileNotFoundError as error:
        raise ExportError(f"{path} does not exist") from error
    except Exception as error:  # safetensors raises its own errors for a truncated or malformed file
        raise ExportError(f"{path} is not a readable safetensors file ({type(error).__name__}: {error})") from error


def import_heads(folder: str | Path) -> MedusaHeads:
    """Medusa heads from a vLLM Medusa folder (as :func:`export_heads` writes it, or FasterDecoding's heads
    converted for vLLM), loaded strictly; ``ExportError`` for what medusa-lite's heads cannot hold."""
    folder = Path(folder)
    config, tensors = read_vllm_config(folder / CONFIG_FILE), read_tensors(folder / WEIGHTS_FILE)
    if not config.get("medusa_fc_bias", False):
        raise ExportError(f"{folder}: heads without a bias in their residual blocks (medusa_fc_bias false)")
    shared = bool(config.get("original_lm_head", False))
    token_map = tensors.pop(TOKEN_MAP, None)
    truncated = config.get("truncated_vocab_size", config["vocab_size"])
    if truncated != config["vocab_size"] and token_map is None:
        raise ExportError(f"{folder}: truncated_vocab_size {truncated} without a token_map")
    heads = MedusaHeads(
        MedusaConfig(
            num_heads=config["num_heads"],
            hidden_size=config["hidden_size"],
            vocab_size=config["vocab_size"],
            num_layers=config["num_hidden_layers"],
            use_base_lm_head=shared,
            draft_vocab_size=None if token_map is None else int(token_map.numel()),
            base_model_name_or_path=config.get("base_model_name_or_path"),
        )
    )
    tensors.pop(SHARED_LM_HEAD, None)  # the target's own lm_head: medusa-lite reads it from the target

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise ExportError(f"{folder / WEIGHTS_FILE} lacks {name}, which its config.json needs")
        return tensors.pop(name)

    state = {}
    for i in range(heads.config.num_heads):
        for j in range(heads.config.num_layers):
            for what in ("weight", "bias"):
                state[f"heads.{i}.blocks.{j}.linear.{what}"] = take(block_name(i, j, what))
        if not shared:
            state[f"heads.{i}.lm_head.weight"] = take(lm_head_name(i))
    if tensors:
        raise ExportError(f"{folder / WEIGHTS_FILE}: tensors medusa-lite's heads do not hold: {sorted(tensors)}")
    if token_map is not None:
        state["draft_token_ids"] = token_map
    try:
        heads.load_state_dict(state, strict=True)
    except MedusaError as error:  # misshapen tensors, bad token ids: named, with the file they came from
        raise ExportError(f"{folder / WEIGHTS_FILE}: {error}") from error
    return heads
