"""The sequential drafter as a proposer: EAGLE-2 draft trees, sized by the cost of verifying rows.

Each step the drafter first takes in the pairs committed since its last step (the target's
hidden states that produced the newly committed tokens, :attr:`StepContext.fresh`: the final
ones, or the layers its ``feature_layers`` name), then
grows candidates by its own confidence (:func:`~medusa_lite.drafters.growth.grow_candidates`: each
depth expands the ``topk`` likeliest frontier nodes, each offering ``topk`` children), ranks them
by cumulative probability and keeps as many as pay for their rows: with a
:class:`~medusa_lite.trees.dynamic_tree.DynamicTree`'s measured ``row_costs`` the count that maximises
expected tokens minus ``tokens_per_cost`` x cost (the dynamic tree's rule, counting the rows the
proposers before it already use), else its whole budget.

Candidates are deterministic given the committed text, so the acceptance rule for deterministic
candidates keeps greedy output identical to the target's and sampling exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from medusa_lite.decoding.model import TargetOutput, hidden_state_count
from medusa_lite.drafters.drafting import (
    DEFAULT_DRAFTING_NODES,
    DEFAULT_DRAFTING_TOPK,
    DraftingProposer,
    DraftingRun,
    check_sizes_fit,
)
from medusa_lite.drafters.growth import (
    DrafterCache,
    RootDraft,
    commit_pairs,
    grow_candidates,
    proposal_by_cost,
    ranked_nodes,
)
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.errors import GenerationInputError, IncompatibleHeadsError
from medusa_lite.proposers.base import Candidates, StepContext, TargetStates
from medusa_lite.trees.costs import Proposal
from medusa_lite.trees.dynamic_tree import DynamicTree

DEFAULT_DRAFTER_TOPK = DEFAULT_DRAFTING_TOPK
DEFAULT_DRAFTER_NODES = DEFAULT_DRAFTING_NODES
DRAFTER_SOURCE = "drafter"
# Tokens a step commits in a typical step (bonus token included): what calibration has the drafter
# take in before drafting, as each step begins by appending the newly committed pairs.
CALIBRATION_TAKE_IN = 3


def check_drafter_fits(model, drafter: SequentialDrafter) -> None:
    check_sizes_fit(model, drafter.config, "the drafter")
    config = drafter.config
    states = hidden_state_count(model.base_model)
    if config.feature_layers is not None and max(config.feature_layers) >= states:
        raise IncompatibleHeadsError(
            f"the drafter reads the target's layers {config.feature_layers}, but the model has only "
            f"{states} hidden states (indices 0..{states - 1}): it was trained for another model "
            f"({config.base_model_name_or_path!r})"
        )


class DrafterRun(DraftingRun):
    """One generation's drafter: its KV cache of committed pairs and the last pair's output."""

    name: ClassVar[str] = DRAFTER_SOURCE

    def __init__(self, spec: SequentialDrafterProposer, model, costs: DynamicTree | None):
        super().__init__(spec, spec.drafter, model, costs)
        self.drafter = spec.drafter.eval()
        weight = model.base_model.get_output_embeddings().weight
        self.cache = DrafterCache.empty(self.drafter, weight.device, weight.dtype)
        self.root: RootDraft | None = None

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(self.drafter.config.feature_layers or ())

    def take_in(self, step: StepContext) -> None:
        """Append the pairs committed since the last step: (fresh target features i, the token they produced)."""
        fresh = step.fresh.features(self.drafter.config.feature_layers)
        count = fresh.shape[0]
        expected = step.history.numel() - 1 - self.cache.length
        if count != expected:
            raise GenerationInputError(
                f"the drafter holds {self.cache.length} committed pairs and got {count} fresh hidden states "
                f"for {expected} new tokens"
            )
        self.cache, self.root = commit_pairs(
            self.drafter, self.cache, fresh, step.history[-count:], self.embed, self.lm_head
        )

    @torch.inference_mode()
    def propose(self, step: StepContext) -> Candidates | None:
        self.take_in(step)
        depth = self.spec.draft_depth(step.max_depth)
        if depth == 0 or step.max_nodes == 0:
            return None
        candidates = grow_candidates(
            self.drafter,
            self.cache,
            self.root,
            int(step.root),
            self.embed,
            self.lm_head,
            depth,
            self.spec.topk,
            self.expansion_price(),
        )
        return proposal_by_cost(candidates, step, self.costs, DRAFTER_SOURCE)


@dataclass(frozen=True)
class SequentialDrafterProposer(DraftingProposer):
    """Guesses from a :class:`~medusa_lite.drafters.sequential.drafter.SequentialDrafter` (see the module docstring);
    the settings are :class:`~medusa_lite.drafters.drafting.DraftingProposer`'s (``depth`` None: the depth the
    drafter was trained to draft; it may draft deeper). Each generation keeps the drafter's own cache."""

    drafter: SequentialDrafter
    name: ClassVar[str] = DRAFTER_SOURCE
    module_class: ClassVar[type] = SequentialDrafter
    module_field: ClassVar[str] = "drafter"
    module_what: ClassVar[str] = "the drafter"
    depth_setting: ClassVar[str] = "depth"
    depth_is_fixed: ClassVar[bool] = False
    check_fits: ClassVar[Callable] = staticmethod(check_drafter_fits)
    run_class: ClassVar[type] = DrafterRun

    def packed_rows(self) -> int:
        """The most rows one of its forwards takes while decoding: a depth's ``topk`` expanded nodes, or the pairs
        one step commits (up to ``depth + 1``)."""
        return max(self.topk, self.draft_depth(None) + 1)


def drafter_proposal(spec: SequentialDrafterProposer, model) -> Proposal:
    """What calibration (:mod:`medusa_lite.trees.costs`) times as the drafter's work per step: taking in
    :data:`CALIBRATION_TAKE_IN` committed pairs, then growing its deepest candidate tree and ranking it."""
    config = spec.drafter.config
    depth = spec.draft_depth(None)
    signature = {
        "kind": config.kind,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "guess_vocab_size": config.guess_vocab_size,
        "depth": depth,
        "topk": spec.topk,
        "feature_layers": config.feature_layers,
    }

    def prepare(prefix: TargetOutput, tokens: torch.Tensor, root: torch.Tensor):
        run = DrafterRun(spec, model, None)
        hidden = TargetStates.of(prefix, run.feature_layers).features(config.feature_layers)
        followers = torch.cat([tokens[1:], root])  # pair i is (h_i, the token after it)
        take_in = min(CALIBRATION_TAKE_IN, followers.numel())
        with torch.inference_mode():
            cache, _ = commit_pairs(
                run.drafter, run.cache, hidden[:-take_in], followers[:-take_in], run.embed, run.lm_head
            )

        @torch.inference_mode()
        def propose_once() -> None:
            longer, root_draft = commit_pairs(
                run.drafter, cache, hidden[-take_in:], followers[-take_in:], run.embed, run.lm_head
            )
            ranked_nodes(
                grow_candidates(run.drafter, longer, root_draft, int(root), run.embed, run.lm_head, depth, spec.topk)
            )

        return propose_once

    return Proposal(signature, prepare)
