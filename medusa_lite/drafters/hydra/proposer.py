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

from dataclasses import dataclass
from typing import ClassVar

import torch

from medusa_lite.decoding.model import TargetOutput
from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.drafters.drafting import DraftingRun, bind_to_target, check_drafting_settings, depth_within
from medusa_lite.drafters.growth import (
    candidate_count_limit,
    grow_by_confidence,
    path_tokens,
    proposal_by_cost,
    ranked_nodes,
)
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.errors import GenerationInputError, IncompatibleHeadsError
from medusa_lite.proposers.base import Candidates, Proposer, StepContext, StepLimits
from medusa_lite.trees.costs import Proposal
from medusa_lite.trees.dynamic_tree import DynamicTree

# Children offered per expanded node, and nodes expanded per depth (as the sequential drafter's).
DEFAULT_HYDRA_TOPK = 4
# Most nodes the heads add per step (before any cost-based cut).
DEFAULT_HYDRA_NODES = 12
HYDRA_SOURCE = "hydra"


def check_hydra_fits(model, heads: HydraHeads) -> None:
    hidden = model.base_model.get_input_embeddings().weight.shape[1]
    config = heads.config
    if config.hidden_size != hidden or config.vocab_size != model.vocab_size:
        raise IncompatibleHeadsError(
            f"the Hydra-style heads expect hidden size {config.hidden_size} and vocab size {config.vocab_size}, "
            f"but the model has {hidden} and {model.vocab_size}: they were trained for another model "
            f"({config.base_model_name_or_path!r})"
        )


@dataclass(frozen=True)
class HydraProposer(Proposer):
    """Guesses from :class:`~medusa_lite.drafters.hydra.heads.HydraHeads` (see the module docstring).

    ``depth`` None: every head. ``costs``: the policy whose ``row_costs`` and ``tokens_per_cost``
    size each step; None: ``model.tree`` when that is a :class:`DynamicTree`, else every step adds
    up to ``max_new_nodes``. ``draft_lm_head``: the target lm_head's rows of the heads' draft
    vocabulary, gathered (and packed for few rows) once by ``load``; None: gathered per generation.
    """

    heads: HydraHeads
    topk: int = DEFAULT_HYDRA_TOPK
    max_new_nodes: int = DEFAULT_HYDRA_NODES
    depth: int | None = None
    costs: DynamicTree | None = None
    draft_lm_head: DraftLMHead | None = None
    name: ClassVar[str] = HYDRA_SOURCE

    def __post_init__(self) -> None:
        if not isinstance(self.heads, HydraHeads):
            raise GenerationInputError(
                f"HydraProposer needs medusa_lite.drafters.hydra.heads.HydraHeads, got {type(self.heads).__name__}"
            )
        check_drafting_settings("HydraProposer", self.topk, self.max_new_nodes, self.depth, self.costs)
        if self.depth is not None and self.depth > self.heads.config.num_heads:
            raise GenerationInputError(
                f"HydraProposer.depth {self.depth} is deeper than the heads ({self.heads.config.num_heads})"
            )

    def draft_depth(self, max_depth: int | None) -> int:
        return depth_within(self.heads.config.num_heads if self.depth is None else self.depth, max_depth)

    def packed_rows(self) -> int:
        """The most rows one of its products takes while decoding: a depth's ``topk`` expanded nodes."""
        return self.topk

    def max_nodes(self, limits: StepLimits) -> int:
        topk = min(self.topk, self.heads.config.guess_vocab_size)
        return min(self.max_new_nodes, candidate_count_limit(topk, self.draft_depth(limits.max_depth)))

    def begin(self, model, prompt, limits):
        check_hydra_fits(model, self.heads)
        return HydraRun(self, model, bind_to_target(self.heads, model, self.costs))

    def propose(self, step: StepContext) -> Candidates | None:
        raise GenerationInputError("HydraProposer is bound to a model per generation: generate() calls begin() first")


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
