"""Checks of the arguments to ``generate``: each raises a ``GenerationInputError`` naming the argument."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from medusa_lite.datastore import Datastore
from medusa_lite.errors import GenerationInputError
from medusa_lite.model import MedusaModel, text_config


def as_prompt(input_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    if not isinstance(input_ids, torch.Tensor):
        raise GenerationInputError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}")
    if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
        raise GenerationInputError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() == 2:
        if input_ids.shape[0] != 1:
            raise GenerationInputError(
                f"batch size {input_ids.shape[0]} is not supported: medusa-lite decodes one sequence at a time; "
                "call generate once per prompt"
            )
        input_ids = input_ids[0]
    elif input_ids.dim() != 1:
        raise GenerationInputError(f"input_ids must have shape [1, length] or [length], got {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise GenerationInputError("the prompt is empty: give at least one token (e.g. the BOS token)")
    return input_ids.to(device=device, dtype=torch.long)


def check_token_ids(prompt: torch.Tensor, vocab_size: int) -> None:
    low, high = int(prompt.min()), int(prompt.max())
    if low < 0 or high >= vocab_size:
        raise GenerationInputError(f"prompt holds token id {low if low < 0 else high}, outside the model's vocabulary [0, {vocab_size})")


def check_max_new_tokens(max_new_tokens: int) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise GenerationInputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")


def check_lookup_tokens(lookup_tokens: int, name: str = "lookup_tokens") -> None:
    if isinstance(lookup_tokens, bool) or not isinstance(lookup_tokens, int) or lookup_tokens < 0:
        raise GenerationInputError(f"{name} must be an integer >= 0 (0 turns that lookup off), got {lookup_tokens!r}")


def check_datastore(datastore: Datastore | None, vocab_size: int) -> None:
    if datastore is None:
        return
    if not isinstance(datastore, Datastore):
        raise GenerationInputError(f"datastore must be a medusa_lite.Datastore or None, got {type(datastore).__name__}")
    datastore.check_fits(vocab_size)


def context_limit(model: MedusaModel) -> int | None:
    """The most positions the target attends over: max positions, or a sliding window (our cache is full-attention)."""
    config = text_config(model.base_model)
    limits = [getattr(config, "max_position_embeddings", None)]
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        limits.append(window)
    limits = [limit for limit in limits if isinstance(limit, int) and limit > 0]
    return min(limits) if limits else None


def check_context(prompt_len: int, max_new_tokens: int, limit: int | None) -> None:
    """Raise before decoding when prompt + new tokens cannot fit; the tree is pruned to fit at run time."""
    if limit is not None and prompt_len + max_new_tokens > limit:
        raise GenerationInputError(
            f"prompt of {prompt_len} tokens + max_new_tokens={max_new_tokens} exceeds the model's context of "
            f"{limit} positions; shorten the prompt or lower max_new_tokens to at most {max(limit - prompt_len, 0)}"
        )


def eos_ids(eos_token_id: int | Sequence[int] | None, model: MedusaModel) -> torch.Tensor:
    """EOS ids as a tensor; None means the model's generation_config EOS (as ``model.generate`` does)."""
    if eos_token_id is None:
        generation_config = getattr(model.base_model, "generation_config", None)
        eos_token_id = getattr(generation_config, "eos_token_id", None)
    if eos_token_id is None:
        ids: list[int] = []
    elif isinstance(eos_token_id, int):
        ids = [eos_token_id]
    else:
        ids = [int(i) for i in eos_token_id]
    return torch.tensor(ids, dtype=torch.long, device=model.device)
