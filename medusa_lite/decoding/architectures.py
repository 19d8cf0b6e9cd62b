"""What each model family needs to be verified with a tree, checked before any work.

A tree step feeds the target every candidate at once with a 4D mask (each node sees the prefix and
its own ancestors) and position ids by depth. That is exact for rotary, learned and no position
embeddings, and for full and sliding-window attention (:mod:`medusa_lite.decoding.windows`). Two
kinds of family cannot be verified this way, and are refused up front by name:

- **ALiBi** (Bloom, MPT, Falcon with ``alibi=True``): the bias is built from each key's place in
  the cache, not from its position id, so a node deep in a tree is biased as if it came after all
  its siblings (and Bloom's attention cannot take a 4D mask at all).
- **Recurrent layers** (state-space or linear attention: Mamba, Jamba, Falcon-H1, RWKV...): a layer
  keeps one running state per sequence, which cannot branch over a tree of candidates.

The attention implementation is chosen by what the model class can do
(:func:`tree_attention_implementation`), not assumed.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from medusa_lite.decoding.attention import TREE_SDPA
from medusa_lite.decoding.windows import layer_windows
from medusa_lite.errors import UnsupportedModelError

RECURRENT_FAMILIES = frozenset(
    {
        "bamba",
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "jamba",
        "lfm2",
        "mamba",
        "mamba2",
        "minimax",
        "qwen3_next",
        "recurrent_gemma",
        "rwkv",
        "xlstm",
        "zamba",
        "zamba2",
    }
)
EXACT_ELSEWHERE = "decode it with the model's own generate"


def uses_alibi(config: PretrainedConfig) -> bool:
    """Whether the config's attention adds an ALiBi bias (Bloom always; Falcon and MPT when set)."""
    if config.model_type == "bloom" or getattr(config, "alibi", False) is True:
        return True
    attn_config = getattr(config, "attn_config", None)  # MPT: an object, or a dict in older configs
    if isinstance(attn_config, dict):
        return bool(attn_config.get("alibi", False))
    return bool(getattr(attn_config, "alibi", False))


def check_architecture(config: PretrainedConfig) -> dict[str, int | None]:
    """The target's layer kinds and windows (:func:`~medusa_lite.decoding.windows.layer_windows`), or
    :class:`UnsupportedModelError` naming the family and why a tree cannot verify it."""
    family = config.model_type
    if uses_alibi(config):
        raise UnsupportedModelError(
            f"{family} uses ALiBi position biases, which follow each key's place in the cache rather than its "
            f"position id, so a tree of candidates cannot be verified exactly: {EXACT_ELSEWHERE}"
        )
    if family in RECURRENT_FAMILIES:
        raise UnsupportedModelError(
            f"{family} has recurrent (state-space or linear-attention) layers, whose one running state per "
            f"sequence cannot branch over a tree of candidates: {EXACT_ELSEWHERE}"
        )
    return layer_windows(config)


def model_class_for(config: PretrainedConfig) -> type | None:
    """The causal-LM class transformers builds for ``config``, or None when it has none registered."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        return None


def tree_attention_implementation(model_class: type | None) -> str:
    """The fastest attention that takes a tree mask in ``model_class``: medusa-lite's tree SDPA where the
    class takes a registered attention function, else torch's SDPA, else eager (Gemma-2, older
    families). A class unknown here gets the tree SDPA, and transformers says if it cannot."""
    if model_class is None:
        return TREE_SDPA
    sdpa = getattr(model_class, "_supports_sdpa", False)
    if sdpa and getattr(model_class, "_supports_attention_backend", False):
        return TREE_SDPA
    return "sdpa" if sdpa else "eager"
