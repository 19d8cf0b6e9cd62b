"""Sliding-window attention in a tree step: each node sees only the keys inside its own window.

Mistral, Starcoder2, Phi-3 and Mixtral attend over a sliding window in every layer; Gemma-2/3,
Cohere-2 and Qwen2/3 with ``use_sliding_window`` mix sliding and full-attention layers
(``config.layer_types``). ``model.generate`` lets a token at position ``q`` of a sliding layer see
the keys at positions ``k`` with ``q - window < k <= q`` (transformers' ``sliding_window_overlay``).

medusa-lite's cache keeps every position in every layer (:mod:`medusa_lite.decoding.cache`), so the
window is a matter of the mask alone: a tree node at position ``prefix_len + depth`` sees the
cached prefix and its own ancestors, less what lies outside its window. transformers takes the
masks of a tree step as one 4D tensor (used for every layer) or, in the models that mix layer kinds,
as a dict keyed by layer type, which it then uses as it is; the prompt's own forward gets
transformers' masks, built from the same positions.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import PretrainedConfig

from medusa_lite.errors import UnsupportedModelError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
KNOWN_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


def sliding_window(config: PretrainedConfig) -> int | None:
    """The window of the config's sliding layers, or None when it has none."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0 or not getattr(config, "use_sliding_window", True):
        return None
    return window


def attention_layer_types(config: PretrainedConfig) -> tuple[str, ...]:
    """Each layer's attention kind: ``config.layer_types`` or, without it, the same kind in every layer."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        kind = SLIDING_ATTENTION if sliding_window(config) is not None else FULL_ATTENTION
        return (kind,) * config.num_hidden_layers
    return tuple(layer_types)


def layer_windows(config: PretrainedConfig) -> dict[str, int | None]:
    """The layer kinds the target uses and each kind's window (None: full attention).

    Raises :class:`UnsupportedModelError`, naming the family, for a kind a tree mask cannot express
    here (chunked, linear or state-space layers).
    """
    kinds = sorted(set(attention_layer_types(config)))
    unknown = [kind for kind in kinds if kind not in KNOWN_LAYER_TYPES]
    if unknown:
        raise UnsupportedModelError(
            f"{config.model_type} has {', '.join(unknown)} layers: medusa-lite verifies a tree with full and "
            "sliding-window attention only"
        )
    window = sliding_window(config)
    if SLIDING_ATTENTION in kinds and window is None:
        raise UnsupportedModelError(f"{config.model_type} has sliding-attention layers but no sliding_window set")
    return {kind: window if kind == SLIDING_ATTENTION else None for kind in kinds}


def key_positions(prefix_len: int, query_positions: torch.Tensor) -> torch.Tensor:
    """The positions of the keys a step attends over: the cached prefix, then the step's own rows."""
    return torch.cat([torch.arange(prefix_len), query_positions.cpu()])


def within_window(query_positions: torch.Tensor, keys: torch.Tensor, window: int | None) -> torch.Tensor | None:
    """[..., Q, K] True where a key (``keys`` [..., K]) lies inside its query's (``query_positions`` [..., Q])
    window (None: no window, everything is). A leading batch dimension is optional."""
    if window is None:
        return None
    return keys.cpu()[..., None, :] > query_positions.cpu()[..., :, None] - window


def additive(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The additive mask [B, 1, Q, K] of a boolean one [B, Q, K] or [Q, K] (B = 1): 0 where attention is allowed,
    dtype-min elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.reshape(-1, 1, *allowed.shape[-2:]).to(device)


def step_masks(
    config: PretrainedConfig,
    allowed: torch.Tensor,
    query_positions: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | Mapping[str, torch.Tensor]:
    """The target's attention masks for one step: ``allowed`` [Q, prefix_len + Q] less what lies outside a window.

    One tensor when every layer is of one kind; a dict by layer type when the target mixes kinds.
    """
    keys = key_positions(allowed.shape[1] - allowed.shape[0], query_positions)
    return layer_kind_masks(config, allowed, query_positions, keys, dtype, device)


def layer_kind_masks(
    config: PretrainedConfig,
    allowed: torch.Tensor,
    query_positions: torch.Tensor,
    keys: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | Mapping[str, torch.Tensor]:
    """:func:`step_masks` for queries at ``query_positions`` [(B,) Q] over keys at positions ``keys`` [(B,) K]:
    ``allowed`` [(B,) Q, K] less what lies outside each layer kind's window (a batch: each row its own positions)."""
    masks = {}
    for kind, window in layer_windows(config).items():
        inside = within_window(query_positions, keys, window)
        masks[kind] = additive(allowed if inside is None else allowed & inside, dtype, device)
    return next(iter(masks.values())) if len(masks) == 1 else masks
