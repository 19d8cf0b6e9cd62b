"""Hydra-style heads: Medusa heads that read the tokens drafted before their guess.

Medusa head k guesses token n+1+k from the target's hidden state h_n (and here the root token
x_{n+1}) alone: it cannot know what the heads before it guessed, and deeper heads fall to chance
(held-out top-1 0.36 -> 0.09 over five depths at equal budget, ``benchmarks/hydra_ablation/``).
Hydra's heads (Ankner et al., 2024) are sequentially dependent: head k reads

    [h_n; E(x_{n+1}); E(x_{n+2}); ...; E(x_{n+k})]

the root and the k - 1 tokens drafted on its path (E: the target's frozen input embedding), maps
it to H with one linear layer (starting as the identity on h_n), then one residual SiLU block, and
guesses token n+1+k through the target's frozen lm_head (or its draft-vocabulary rows). Training
feeds the true tokens (teacher forcing); decoding feeds a path's own drafted tokens, so a draft
tree grows depth by depth by the heads' confidence (:mod:`medusa_lite.drafters.hydra.proposer`).

Against the sequential drafter (:mod:`medusa_lite.drafters.sequential.drafter`) it has no attention, no KV cache and
no forward over each step's committed tokens: a drafted depth is one small product per expanded
node and the projection, which is what a CPU can afford (the ablation: 1.664 expected tokens of a
5-deep greedy chain against Medusa's 1.518 and the drafter's 1.628-1.729, at equal budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from huggingface_hub import ModelCard
from torch import nn

from medusa_lite.artifacts.base import DRAFT_IDS_NAME, ArtifactConfig, HubArtifact, check_draft_vocab_size
from medusa_lite.artifacts.card import drafter_card
from medusa_lite.drafters.draft_vocab import guess_logits
from medusa_lite.drafters.medusa.heads import ResBlock, path_reader

# The ``kind`` a Hydra-style artifact's config.json records.
HYDRA_KIND = "hydra-heads"
HYDRA_WHAT = "Hydra-style heads"
HYDRA_TAGS = ("medusa-lite", "speculative-decoding", "hydra")


@dataclass
class HydraConfig(ArtifactConfig):
    """Shape of Hydra-style heads and the model they were trained for.

    ``num_heads = K``: head k (1..K) guesses depth k of a draft. ``draft_vocab_size = D``
    restricts guesses to the D ids of the ``draft_token_ids`` buffer, as for Medusa heads.
    """

    config_what: ClassVar[str] = "Hydra-style heads"

    num_heads: int
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int | None = None
    kind: str = HYDRA_KIND
    base_model_name_or_path: str | None = None
    # Free-form facts about how the heads were made (data, accuracies); never read by the code.
    training_summary: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_heads", "hidden_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"HydraConfig.{name} must be a positive integer, got {value!r}")
        if self.kind != HYDRA_KIND:
            raise ValueError(f"HydraConfig.kind must be {HYDRA_KIND!r}, got {self.kind!r}")
        check_draft_vocab_size("HydraConfig", self.draft_vocab_size, self.vocab_size)
        if not isinstance(self.training_summary, dict):
            raise ValueError(f"HydraConfig.training_summary must be a JSON object, got {self.training_summary!r}")


class HydraHeads(HubArtifact, tags=list(HYDRA_TAGS)):
    """K heads; head k reads [h; E(path of k tokens)] (see the module docstring). Decoding state lives outside."""

    artifact_what: ClassVar[str] = HYDRA_WHAT
    config_class: ClassVar[type] = HydraConfig

    def __init__(self, config: HydraConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.readers = nn.ModuleList(path_reader(hidden, k) for k in range(1, config.num_heads + 1))
        self.blocks = nn.ModuleList(ResBlock(hidden) for _ in range(config.num_heads))
        placeholder = None if config.draft_vocab_size is None else torch.arange(config.draft_vocab_size)
        self.register_buffer(DRAFT_IDS_NAME, placeholder, persistent=True)

    def head(self, k: int, hidden: torch.Tensor, path_embeds: torch.Tensor) -> torch.Tensor:
        """Head ``k`` (1-based): hidden [..., H] and the embeddings of its k path tokens [..., k, H] -> [..., H]."""
        if not 1 <= k <= self.config.num_heads:
            raise ValueError(f"these Hydra-style heads have heads 1..{self.config.num_heads}, not {k}")
        if path_embeds.shape[-2] != k:
            raise ValueError(f"head {k} reads {k} path tokens, got {path_embeds.shape[-2]}")
        read = torch.cat([hidden, path_embeds.to(hidden.dtype).flatten(-2)], dim=-1)
        return self.blocks[k - 1](self.readers[k - 1](read))

    def forward(self, hidden: torch.Tensor, path_embeds: torch.Tensor) -> torch.Tensor:
        """Teacher-forced, every head: hidden [..., H], embeddings of the K path tokens [..., K, H] -> [..., K, H]."""
        heads = self.config.num_heads
        return torch.stack([self.head(k, hidden, path_embeds[..., :k, :]) for k in range(1, heads + 1)], dim=-2)

    def project(self, head_hidden: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """Heads' outputs [..., H] -> logits [..., G] (G: the draft vocabulary's size, else V)."""
        return guess_logits(head_hidden, base_lm_head, self.draft_token_ids, HYDRA_WHAT)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        config = self.config
        return ModelCard(
            drafter_card(
                HYDRA_TAGS,
                f"Hydra-style heads for {config.base_model_name_or_path or 'their base model'}",
                "medusa-lite Hydra-style heads: head k reads the target's hidden state and the k tokens drafted on "
                "its path, so each depth knows what the depths before it guessed. Load with "
                "`medusa_lite.load(model, heads=<this repo>)`.",
                [f"heads: {config.num_heads}", f"draft vocabulary: {config.draft_vocab_size or 'full'}"],
                config.training_summary,
            )
        )
