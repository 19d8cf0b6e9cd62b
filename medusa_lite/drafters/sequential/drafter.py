"""A sequential drafter: one small decoder layer that drafts depth d from its own draft at depths < d.

Medusa heads guess the token d steps ahead from the target's last hidden state alone, so head d
cannot know what heads 1..d-1 guessed. This drafter (after EAGLE / EAGLE-3; Hydra conditions
Medusa-style heads on the drafted tokens for the same reason) is autoregressive:

- Its input at a position is the pair (feature, token): the target's final hidden state h_i (or,
  with ``feature_layers``, EAGLE-3's low, middle and high layers at i, reduced to H by one linear
  layer) and the embedding of the token x_{i+1} that followed it (the target's own frozen input
  embedding), normalised and fused by one linear layer into one H-vector.
- One pre-norm decoder layer (self-attention with rotary positions over the drafter's own earlier
  positions, then a SwiGLU MLP) turns it into an output feature, whose normalised value goes
  through the target's frozen lm_head (or its draft-vocabulary rows) to give the next token's
  logits.
- Drafting deeper, the drafter's *own* output feature stands in for the target's feature, paired
  with the drafted token: depth d reads what it drafted at depth d - 1, and through attention
  everything before.

So the artifact holds only the fused projection, the layer and three norms (~4.2M parameters,
~17 MB in float32, for SmolLM2-135M; three feature layers add ~1M): the embedding and lm_head
are the target's.

Positions and caching (decoding): with committed tokens x_0..x_n (x_n, the tree's root, chosen by
the target), the drafter's KV cache holds one entry per committed pair (h_i, x_{i+1}),
i = 0..n-1, at position i. The last entry's output gives the root's children (depth 1) and the
feature depth 2 reads. A tree node at depth e >= 1 is expanded by feeding (its parent's output
feature, its token) at position n - 1 + e, attending to the cache and its expanded ancestors.
After verification the cache is cut back to the committed pairs and the newly accepted ones are
appended with the target's true features: the prefix is never run again.

Training (:mod:`medusa_lite.training.drafter_objective`) runs the same computation for every
position of a sequence at once, depth after depth ("training-time test", EAGLE-3): depth d's rows
read depth d-1's output features, attend causally to the true pairs and to their own position's
rows of the earlier depths, exactly as decoding does along a drafted path.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.artifacts.base import DRAFT_IDS_NAME, ArtifactConfig, HubArtifact, check_draft_vocab_size
from medusa_lite.artifacts.card import drafter_card
from medusa_lite.drafters.draft_vocab import guess_logits

# The ``kind`` a drafter's config.json records (Medusa heads' configs have no ``kind``).
DRAFTER_KIND = "sequential-drafter"
# How errors name what a folder or repo was meant to hold.
DRAFTER_WHAT = "drafter"
DRAFTER_TAGS = ("medusa-lite", "speculative-decoding", "eagle")
DEFAULT_DRAFT_DEPTH = 4


@dataclass
class DrafterConfig(ArtifactConfig):
    """Shape of a sequential drafter and the model it was trained for.

    Sizes default to the target's (see :meth:`for_model`). ``depth``: how many drafting depths
    training unrolled (decoding may draft as deep, no deeper). ``draft_vocab_size = D`` restricts
    guesses to the D ids of the ``draft_token_ids`` buffer, as for Medusa heads.
    """

    config_what: ClassVar[str] = "drafter"

    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    depth: int = DEFAULT_DRAFT_DEPTH
    draft_vocab_size: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Which of the target's hidden states depth 1 reads, as indices into its ``hidden_states``
    # (0: the embeddings, i: the output of decoder layer i, the last: the final, post-norm state).
    # None: the final hidden state alone. Several (EAGLE-3: a low, a middle and a high layer) are
    # each RMS-normalised, concatenated and reduced to H by one more linear layer.
    feature_layers: list[int] | None = None
    kind: str = DRAFTER_KIND
    base_model_name_or_path: str | None = None
    # Free-form facts about how the drafter was made (data, accuracies); never read by the code.
    training_summary: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "vocab_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "depth",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"DrafterConfig.{name} must be a positive integer, got {value!r}")
        if self.kind != DRAFTER_KIND:
            raise ValueError(f"DrafterConfig.kind must be {DRAFTER_KIND!r}, got {self.kind!r}")
        if self.hidden_size % self.num_attention_heads or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"DrafterConfig: hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                f"{self.num_attention_heads}, "
                f"itself a multiple of num_key_value_heads {self.num_key_value_heads}"
            )
        if self.feature_layers is not None:
            self.feature_layers = list(self.feature_layers)
            layers = self.feature_layers
            if (
                not layers
                or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in layers)
                or len(set(layers)) != len(layers)
            ):
                raise ValueError(
                    "DrafterConfig.feature_layers must be None or a non-empty list of distinct layer indices >= 0, "
                    f"got {layers!r}"
                )
        check_draft_vocab_size("DrafterConfig", self.draft_vocab_size, self.vocab_size)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def feature_width(self) -> int:
        """Width of the target features depth 1 reads: H per feature layer (H for the final hidden state)."""
        return self.hidden_size * len(self.feature_layers or [None])

    @classmethod
    def for_model(cls, base_model, **overrides) -> DrafterConfig:
        """A config sized like ``base_model``'s decoder layers (attention heads, MLP width, rotary base)."""
        config = (
            base_model.config.get_text_config(decoder=True)
            if hasattr(base_model.config, "get_text_config")
            else base_model.config
        )
        rope = getattr(config, "rope_parameters", None) or {}
        values = dict(
            hidden_size=config.hidden_size,
            vocab_size=base_model.get_output_embeddings().weight.shape[0],
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-5)),
            rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            base_model_name_or_path=getattr(config, "_name_or_path", None) or None,
        )
        return cls(**{**values, **overrides})


@functools.cache
def inverse_frequencies(head_dim: int, theta: float, device: torch.device) -> torch.Tensor:
    """Rotary frequencies [head_dim / 2]: computed once per shape and device, not at every drafted depth."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def rotary(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [..., head_dim] of rotary embeddings at ``positions`` (Llama's half-split layout)."""
    angles = positions.float()[..., None] * inverse_frequencies(head_dim, theta, positions.device)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply rotary embeddings to x [..., heads, n, head_dim] with cos/sin [..., n, head_dim]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-3) + turned * sin.unsqueeze(-3)


@dataclass
class DrafterStep:
    """One drafter forward: output features (what the next depth reads) and the rows' keys/values."""

    features: torch.Tensor  # [..., n, H], before the output norm
    keys: torch.Tensor  # [..., kv_heads, n, head_dim], rotated
    values: torch.Tensor  # [..., kv_heads, n, head_dim]


class SequentialDrafter(HubArtifact, tags=list(DRAFTER_TAGS)):
    """The drafter's weights (see the module docstring); decoding state lives outside it."""

    artifact_what: ClassVar[str] = DRAFTER_WHAT
    config_class: ClassVar[type] = DrafterConfig

    def __init__(self, config: DrafterConfig):
        super().__init__()
        self.config = config
        hidden, heads, kv_heads, dim = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        eps = config.rms_norm_eps
        self.feature_norm = nn.RMSNorm(hidden, eps=eps)
        self.token_norm = nn.RMSNorm(hidden, eps=eps)
        self.fuse = nn.Linear(2 * hidden, hidden, bias=False)
        # several target layers [..., k*H] -> one feature [..., H]; None when reading the final hidden state
        self.reduce = (
            nn.Linear(config.feature_width, hidden, bias=False) if config.feature_layers is not None else None
        )
        self.attention_norm = nn.RMSNorm(hidden, eps=eps)
        self.q_proj = nn.Linear(hidden, heads * dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(hidden, eps=eps)
        self.gate_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, hidden, bias=False)
        self.output_norm = nn.RMSNorm(hidden, eps=eps)
        placeholder = None if config.draft_vocab_size is None else torch.arange(config.draft_vocab_size)
        self.register_buffer(DRAFT_IDS_NAME, placeholder, persistent=True)

    # -- the layer ---------------------------------------------------------------------------
    def target_feature(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [..., n, W] (W = ``config.feature_width``, its layers side by side in
        ``config.feature_layers`` order) -> what depth 1 reads [..., n, H]."""
        config = self.config
        if features.shape[-1] != config.feature_width:
            raise ValueError(
                f"the drafter reads target features of width {config.feature_width} (feature_layers "
                f"{config.feature_layers}), got {features.shape[-1]}"
            )
        if self.reduce is None:
            return features
        layers = features.unflatten(-1, (-1, config.hidden_size))
        return self.reduce(F.rms_norm(layers, (config.hidden_size,), eps=config.rms_norm_eps).flatten(-2))

    def fused_input(self, features: torch.Tensor, token_embeds: torch.Tensor) -> torch.Tensor:
        """(feature, token embedding) pairs [..., n, H] each -> the layer's input [..., n, H]."""
        return self.fuse(
            torch.cat([self.feature_norm(features), self.token_norm(token_embeds.to(features.dtype))], dim=-1)
        )

    def split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.unflatten(-1, (heads, self.config.head_dim)).transpose(-3, -2)  # [..., heads, n, dim]

    def forward(
        self,
        features: torch.Tensor,
        token_embeds: torch.Tensor,
        positions: torch.Tensor,
        attend,
    ) -> DrafterStep:
        """Run n rows [..., n, H] at ``positions`` [..., n]; ``attend(q, k, v)`` does the attention.

        ``attend`` gets this call's rotated queries [..., heads, n, dim] and keys/values
        [..., kv_heads, n, dim] and returns [..., heads, n, dim]: it adds the context (cached or
        earlier-depth entries) and the mask, so one layer serves decoding and training alike.
        """
        config = self.config
        x = self.fused_input(features, token_embeds)
        normed = self.attention_norm(x)
        cos, sin = rotary(positions, config.head_dim, config.rope_theta, x.dtype)
        q = rotate(self.split_heads(self.q_proj(normed), config.num_attention_heads), cos, sin)
        k = rotate(self.split_heads(self.k_proj(normed), config.num_key_value_heads), cos, sin)
        v = self.split_heads(self.v_proj(normed), config.num_key_value_heads)
        x = x + self.o_proj(attend(q, k, v).transpose(-3, -2).flatten(-2))
        normed = self.mlp_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))
        return DrafterStep(x, k, v)

    def project(self, features: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """Output features [..., H] -> logits [..., G] (G: the draft vocabulary's size, else V).

        ``base_lm_head``: the target's output layer, or a :class:`DraftLMHead` gathered once from
        this drafter's ids (what decoding passes).
        """
        return guess_logits(self.output_norm(features), base_lm_head, self.draft_token_ids, DRAFTER_WHAT)

    def generate_model_card(self, *args, **kwargs):
        from huggingface_hub import ModelCard

        config = self.config
        return ModelCard(
            drafter_card(
                DRAFTER_TAGS,
                f"Sequential drafter for {config.base_model_name_or_path or 'its base model'}",
                "A medusa-lite sequential drafter (EAGLE-style: one decoder layer over [target feature, token "
                "embedding], drafting depth d from its own depth d-1). Load with "
                "`medusa_lite.load(model, heads=<this repo>)`.",
                [
                    f"depth trained: {config.depth}",
                    f"draft vocabulary: {config.draft_vocab_size or 'full'}",
                    f"target features read: {config.feature_layers or 'the final hidden state'}",
                ],
                config.training_summary,
            )
        )


# -- attention -----------------------------------------------------------------------------------
def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Attention of q [heads, n, dim] over keys/values [kv_heads, m, dim] where ``allowed`` [n, m] (bool).

    Query head h reads key/value head h // (heads / kv_heads), as grouped-query attention does; the
    groups' queries are stacked [kv_heads, group * n, dim] so that one product serves each key head
    (PyTorch's SDPA with grouped heads and a mask takes its slower generic path on CPU: docs/results.md,
    "Measurements behind the code's choices").
    """
    heads, n, dim = q.shape
    kv_heads, m = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    scores = (q.reshape(kv_heads, group * n, dim) @ keys.transpose(-1, -2)) * dim**-0.5
    blocked = ~allowed.expand(group, n, m).reshape(group * n, m)
    weights = scores.masked_fill(blocked, torch.finfo(scores.dtype).min).softmax(dim=-1)
    return (weights @ values).reshape(heads, n, dim)


def causal_plus_own_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    earlier_k: list[torch.Tensor],
    earlier_v: list[torch.Tensor],
    true_k: torch.Tensor,
    true_v: torch.Tensor,
) -> torch.Tensor:
    """Training-time attention of depth d's rows: causal over the true pairs, plus their own position's earlier depths.

    q [B, heads, T, dim]; k, v and each of ``earlier_*`` (depths 2..d-1) and ``true_*`` (depth 1)
    [B, kv_heads, T, dim]. Row t attends to true pairs 0..t and to row t of every depth >= 2 up
    to its own: the keys a drafted path's node sees at decoding time. Depth 1 itself passes
    ``true_k is k`` and no earlier depths.
    """
    group = q.shape[1] // k.shape[1]
    expand = lambda x: x.repeat_interleave(group, dim=1)  # noqa: E731
    scale = q.shape[-1] ** -0.5
    length = q.shape[2]
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    scores = (q @ expand(true_k).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    own_k = [*earlier_k, k] if true_k is not k else []
    own_v = [*earlier_v, v] if true_k is not k else []
    own = [(q * expand(key)).sum(-1, keepdim=True) * scale for key in own_k]  # [B, heads, T, 1] each
    weights = torch.cat([scores, *own], dim=-1).softmax(dim=-1)
    out = weights[..., :length] @ expand(true_v)
    for index, value in enumerate(own_v):
        out = out + weights[..., length + index : length + index + 1] * expand(value)
    return out
