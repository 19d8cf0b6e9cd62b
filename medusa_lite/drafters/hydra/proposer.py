"""Hydra-style heads as a proposer: draft trees grown by the heads' confidence, sized by the cost of verifying rows.

Each step, head 1 reads the target's last hidden state and the root token and offers its
``topk`` likeliest children; at each further depth the ``topk`` likeliest frontier nodes (by
cumulative probability) are expanded together, head d reading each node's path (the root and the
d - 1 tokens drafted down to it); :func:`~medusa_lite.drafters.growth.grow_by_confidence` stops where
the frontier cannot pay for another expansion. The candidates are then ranked and as many kept as
pay for their rows (:func:`~medusa_lite.drafters.growth.proposal_by_cost`, the dynamic tree's rule).

The heads keep no state between steps (no cache, nothing to roll back), and their candidates are a
deterministic function of the committed text and the target's hidden state, so the acceptance rule
for deterministic candidates keeps greedy output identical to the target's and sampling exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from medusa_lite.decoding.model import TargetOutput
from medusa_lite.drafters.drafting import (
    DEFAULT_DRAFTING_NODES,
    DEFAULT_DRAFTING_TOPK,
    DraftingProposer,
    DraftingRun,
    check_sizes_fit,
)
from medusa_lite.drafters.growth import (
    grow_by_confidence,
    path_tokens,
    proposal_by_cost,
    ranked_nodes,
)
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.proposers.base import Candidates, StepContext
from medusa_lite.trees.costs import Proposal
from medusa_lite.trees.dynamic_tree import DynamicTree

DEFAULT_HYDRA_TOPK = DEFAULT_DRAFTING_TOPK
DEFAULT_HYDRA_NODES = DEFAULT_DRAFTING_NODES
HYDRA_SOURCE = "hydra"


def check_hydra_fits(model, heads: HydraHeads) -> None:
    check_sizes_fit(model, heads.config, "the Hydra-style heads")


class HydraRun(DraftingRun):
    """One generation's Hydra-style heads: bound to the target's embedding, projection and step costs."""

    name: ClassVar[str] = HYDRA_SOURCE

    def __init__(self, spec: HydraProposer, model, costs: DynamicTree | None):
        super().__init__(spec, spec.heads, model, costs)
        self.heads = spec.heads.eval()

    def grow(self, hidden: torch.Tensor, root: torch.Tensor, depth: int, expansion_price: float):
        """The candidates of one step: ``hidden`` [H] the target's last hidden state, ``root`` [1] the root token."""
        heads, embed, lm_head = self.heads, self.embed, self.lm_head
        hidden = hidden.to(next(heads.parameters()).dtype)

        def guesses(paths: list[list[int]]) -> torch.Tensor:
            """Logits [m, G] of head len(path) for each path (the root first)."""
            embeds = embed(torch.tensor(paths, device=root.device))  # [m, k, H]
            read = heads.head(len(paths[0]), hidden.expand(len(paths), -1), embeds)
            return heads.project(read, lm_head)

        def expand(candidates, frontier: list[int], level: int) -> torch.Tensor:
            return guesses([path_tokens(candidates, node) for node in frontier])

        root_token = int(root)
        root_logits = guesses([[root_token]])[0]
        return grow_by_confidence(
            root_logits, root_token, heads.guess_ids, expand, depth, self.spec.topk, expansion_price
        )

    @torch.inference_mode()
    def propose(self, step: StepContext) -> Candidates | None:
        depth = self.spec.draft_depth(step.max_depth)
        if depth == 0 or step.max_nodes == 0:
            return None
        candidates = self.grow(step.hidden, step.root, depth, self.expansion_price())
        return proposal_by_cost(candidates, step, self.costs, HYDRA_SOURCE)


@dataclass(frozen=True)
class HydraProposer(DraftingProposer):
    """Guesses from :class:`~medusa_lite.drafters.hydra.heads.HydraHeads` (see the module docstring); the
    settings are :class:`~medusa_lite.drafters.drafting.DraftingProposer`'s (``depth`` None: every head)."""

    heads: HydraHeads
    name: ClassVar[str] = HYDRA_SOURCE
    module_class: ClassVar[type] = HydraHeads
    module_field: ClassVar[str] = "heads"
    module_what: ClassVar[str] = "the heads"
    depth_setting: ClassVar[str] = "num_heads"
    depth_is_fixed: ClassVar[bool] = True
    check_fits: ClassVar[Callable] = staticmethod(check_hydra_fits)
    run_class: ClassVar[type] = HydraRun

    def packed_rows(self) -> int:
        """The most rows one of its products takes while decoding: a depth's ``topk`` expanded nodes."""
        return self.topk


def hydra_proposal(spec: HydraProposer, model) -> Proposal:
    """What calibration (:mod:`medusa_lite.trees.costs`) times as the heads' work per step: growing their deepest
    candidate tree from the prefix's last hidden state, and ranking it."""
    config = spec.heads.config
    depth = spec.draft_depth(None)
    signature = {
        "kind": config.kind,
        "hidden_size": config.hidden_size,
        "guess_vocab_size": config.guess_vocab_size,
        "depth": depth,
        "topk": spec.topk,
    }

    def prepare(prefix: TargetOutput, tokens: torch.Tensor, root: torch.Tensor):
        run = HydraRun(spec, model, None)

        @torch.inference_mode()
        def propose_once() -> None:
            ranked_nodes(run.grow(prefix.hidden[-1], root, depth, 0.0))

        return propose_once

    return Proposal(signature, prepare)
