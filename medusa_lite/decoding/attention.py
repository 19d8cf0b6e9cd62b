"""``"medusa_lite_sdpa"``: transformers' SDPA attention, without copying keys and values per head under a tree mask.

Tree verification hands the target a custom 4D mask. With a mask, transformers' ``sdpa``
expands grouped-query keys and values to one copy per query head (``repeat_kv``) before calling
PyTorch's SDPA, because on CUDA a masked grouped-query SDPA falls back to the slow math kernel.
On a CPU that copy is the expensive part of a tree step for a grouped-query model, and a masked
call with ``enable_gqa=True`` gives bit for bit the same output for about half the time
(docs/results.md, "Measurements behind the code's choices").

So this backend is ``sdpa`` with one change: on a CPU, a masked grouped-query call runs inside
SDPA with ``enable_gqa=True``. Everything else (no mask, one key/value group, other devices,
position biases) is transformers' own ``sdpa_attention_forward``, and the masks are ``sdpa``'s, so
plain decoding through a model loaded with it is unchanged. It is registered with
transformers' ``AttentionInterface`` / ``AttentionMaskInterface`` on import, the documented way to
add an attention backend; :func:`medusa_lite.load` loads targets with it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

TREE_SDPA = "medusa_lite_sdpa"


def runs_gqa_inside_sdpa(
    module: torch.nn.Module, query: torch.Tensor, attention_mask: torch.Tensor | None, kwargs: dict
) -> bool:
    """Whether this call is a masked grouped-query attention on a CPU that SDPA can take as it is."""
    return (
        attention_mask is not None
        and query.device.type == "cpu"
        and getattr(module, "num_key_value_groups", 1) > 1
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    )


def tree_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa_attention_forward``, except masked grouped-query attention on a CPU (``enable_gqa``)."""
    if not runs_gqa_inside_sdpa(module, query, attention_mask, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(TREE_SDPA, tree_sdpa_attention_forward)
AttentionMaskInterface.register(TREE_SDPA, sdpa_mask)
