"""Medusa heads: K small residual blocks on the target's last hidden state.

Head k (k = 1..K) guesses the token k+1 positions ahead of the hidden state it reads: with the
hidden state at position n (whose base logits predict token n+1), head k predicts token n+1+k.
Heads with ``next_token_input`` also read token n+1 itself (the tree's root, which the target has
chosen before the heads guess): see :class:`MedusaConfig`.

The heads are an adapter in the PEFT sense: a config dataclass naming its base model, a module,
and a Hub folder of ``config.json`` + ``model.safetensors`` (saved and pushed with
``PyTorchModelHubMixin``, loaded strictly with clear errors by :meth:`MedusaHeads.from_pretrained`).

A *draft vocabulary* (``MedusaConfig.draft_vocab_size = D``, as EAGLE-3's draft vocab) lets the
heads guess among D frequent tokens only instead of all V: their projection then multiplies by
D rows of the base lm_head instead of V (on SmolLM2-135M, 8192 of 49,152 rows), which makes
training ~6x cheaper and decoding steps cheaper too. Decoding stays exact (the target verifies
every guess); a token outside the draft vocabulary can simply never be guessed.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from huggingface_hub import ModelCard
from torch import nn

from medusa_lite.artifacts.base import DRAFT_IDS_NAME, HubArtifact
from medusa_lite.drafters.draft_vocab import DraftLMHead, draft_rows
from medusa_lite.drafters.medusa.card import TAGS, model_card
from medusa_lite.drafters.medusa.config import HEADS_WHAT, MedusaConfig
from medusa_lite.errors import DraftVocabError


class ResBlock(nn.Module):
    """x + SiLU(W x + b). W starts at zero, so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHead(nn.Module):
    """One head: ``num_layers`` residual blocks, then its own lm_head if configured."""

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.blocks = nn.Sequential(*(ResBlock(config.hidden_size) for _ in range(config.num_layers)))
        self.lm_head = (
            None if config.use_base_lm_head else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.blocks(hidden)


def path_reader(hidden_size: int, tokens: int) -> nn.Linear:
    """Linear [h; ``tokens`` token embeddings] ((1 + tokens) H) -> H, starting as the identity on h (a head that
    reads the next token, Hydra's head k reading its path of k)."""
    layer = nn.Linear((1 + tokens) * hidden_size, hidden_size)
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[:, :hidden_size].copy_(torch.eye(hidden_size))
        layer.bias.zero_()
    return layer


class MedusaHeads(HubArtifact, tags=list(TAGS)):
    """K independent heads (each its own module: no weight sharing between heads).

    With a draft vocabulary, ``draft_token_ids`` (a persistent LongTensor buffer [D], saved and
    strictly loaded with the weights) names the tokens the heads can guess: index i of the heads'
    logits is token ``draft_token_ids[i]``. Training stores them most frequent first (ties by id);
    any order of distinct in-range ids is valid. A fresh module holds the placeholder ids
    ``0..D-1`` until :meth:`set_draft_vocab` or loading replaces them. Without one it is None.
    """

    artifact_what: ClassVar[str] = HEADS_WHAT
    config_class: ClassVar[type] = MedusaConfig

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(MedusaHead(config) for _ in range(config.num_heads))
        self.next_token_fuse = path_reader(config.hidden_size, 1) if config.next_token_input else None
        placeholder = None if config.draft_vocab_size is None else torch.arange(config.draft_vocab_size)
        self.register_buffer(DRAFT_IDS_NAME, placeholder, persistent=True)

    def forward(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_token_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Hidden states [..., H] -> the first ``num_heads`` (default all) heads' hidden states [..., k, H].

        ``next_token_embeds`` [..., H]: the base model's input embeddings of the token following
        each hidden state; required by heads with ``config.next_token_input``, refused by others.
        """
        if self.next_token_fuse is not None:
            if next_token_embeds is None:
                raise ValueError("these heads read the next token (config.next_token_input): pass next_token_embeds")
            hidden = self.next_token_fuse(torch.cat([hidden, next_token_embeds.to(hidden.dtype)], dim=-1))
        elif next_token_embeds is not None:
            raise ValueError(
                "next_token_embeds given to heads that do not read the next token (config.next_token_input is false)"
            )
        return torch.stack([head(hidden) for head in self.heads[:num_heads]], dim=-2)

    def project(self, head_hidden: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
        """Per-head hidden states [..., k, H] (the first k heads) -> per-head logits [..., k, G].

        G is ``config.guess_vocab_size``: V, or D with a draft vocabulary (logit i is then token
        ``draft_token_ids[i]``). ``base_lm_head`` is the base model's output layer; with a draft
        vocabulary it may instead be a :class:`DraftLMHead` gathered once for these heads (what
        ``MedusaModel`` passes while decoding). Given the full layer, the draft rows are gathered
        for this call (cheap next to the projection; what training does, where the ids may change
        on resume).
        """
        if isinstance(base_lm_head, DraftLMHead):
            if self.draft_token_ids is None or base_lm_head.weight.shape[0] != self.config.draft_vocab_size:
                raise DraftVocabError(
                    f"a DraftLMHead of {base_lm_head.weight.shape[0]} rows was given to heads whose draft "
                    "vocabulary size is "
                    f"{self.config.draft_vocab_size}; pass the base model's lm_head or a DraftLMHead made "
                    "from these heads' ids"
                )
            return base_lm_head(head_hidden)
        if self.draft_token_ids is not None:
            return F.linear(head_hidden, *draft_rows(base_lm_head, self.draft_token_ids))
        if self.config.use_base_lm_head:
            return base_lm_head(head_hidden)
        return torch.stack(
            [self.heads[k].lm_head(head_hidden[..., k, :]) for k in range(head_hidden.shape[-2])], dim=-2
        )

    def init_lm_heads_from(self, base_lm_head: nn.Module) -> None:
        """Copy the base model's output projection into each head's own lm_head (if any)."""
        if self.config.use_base_lm_head:
            return
        with torch.no_grad():
            for head in self.heads:
                head.lm_head.weight.copy_(base_lm_head.weight)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The README written by ``save_pretrained``/``push_to_hub``: our card, from the config."""
        return ModelCard(model_card(self.config))
