"""What the drafters that grow their own trees share as proposers (Hydra-style heads, the sequential drafter):
their settings' checks, binding to the target for a generation, and one generation's run: the target's
embedding and (draft-vocabulary) projection, and the step costs that price each expansion."""

from __future__ import annotations

import torch

from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.base import Proposer, StepLimits
from medusa_lite.trees.dynamic_tree import DynamicTree


def check_drafting_settings(owner: str, topk, max_new_nodes, depth, costs) -> None:
    """``topk`` and ``max_new_nodes`` integers >= 1, ``depth`` None or an integer >= 0, ``costs`` None or a
    :class:`DynamicTree`; else a :class:`GenerationInputError` naming ``owner``'s setting."""
    for name, value in (("topk", topk), ("max_new_nodes", max_new_nodes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GenerationInputError(f"{owner}.{name} must be an integer >= 1, got {value!r}")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 0):
        raise GenerationInputError(f"{owner}.depth must be None or an integer >= 0, got {depth!r}")
    if costs is not None and not isinstance(costs, DynamicTree):
        raise GenerationInputError(
            f"{owner}.costs must be a DynamicTree (its row_costs) or None, got {type(costs).__name__}"
        )


def depth_within(depth: int, max_depth: int | None) -> int:
    return depth if max_depth is None else max(min(depth, max_depth), 0)


def bind_to_target(module: torch.nn.Module, model, costs: DynamicTree | None) -> DynamicTree | None:
    """Put ``module`` on the target's device and dtype; the step costs a generation prices by: ``costs``, else
    ``model.tree`` when that is a :class:`DynamicTree`, else None (unpriced)."""
    weight = model.base_model.get_output_embeddings().weight
    parameter = next(module.parameters())
    if parameter.device != weight.device or parameter.dtype != weight.dtype:
        module.to(device=weight.device, dtype=weight.dtype)
    return costs if costs is not None else (model.tree if isinstance(model.tree, DynamicTree) else None)


class DraftingRun(Proposer):
    """One generation of a drafter ``module`` configured by ``spec`` (its ``topk``, ``draft_depth``,
    ``max_nodes`` and ``draft_lm_head``): the target's input embedding, the projection to the drafter's
    guesses, and the step costs (None: unpriced)."""

    def __init__(self, spec, module: torch.nn.Module, model, costs: DynamicTree | None):
        self.spec = spec
        self.embed = model.base_model.get_input_embeddings()
        base_lm_head = model.base_model.get_output_embeddings()
        ids = module.draft_token_ids
        if ids is None:
            self.lm_head = base_lm_head
        else:
            self.lm_head = spec.draft_lm_head if spec.draft_lm_head is not None else DraftLMHead(base_lm_head, ids)
        self.costs = costs

    def max_nodes(self, limits: StepLimits) -> int:
        return self.spec.max_nodes(limits)

    @property
    def pricing(self) -> DynamicTree | None:
        return self.costs

    def expansion_price(self) -> float:
        """Expected tokens one expansion (a drafter forward, a head's products) must buy (0 unpriced): its measured
        share of the proposal's cost (about one expansion per depth) at the policy's ``tokens_per_cost``."""
        if self.costs is None:
            return 0.0
        return self.costs.tokens_per_cost * self.costs.proposal_cost / max(self.spec.draft_depth(None), 1)
