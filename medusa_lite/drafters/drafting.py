"""What the drafters that grow their own trees share as proposers (Hydra-style heads, the sequential drafter):
their settings and their checks (:class:`DraftingProposer`), binding to the target for a generation, and one
generation's run: the target's embedding and (draft-vocabulary) projection, and the step costs that price each
expansion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.drafters.growth import candidate_count_limit
from medusa_lite.errors import GenerationInputError, IncompatibleHeadsError
from medusa_lite.proposers.base import Candidates, Proposer, StepContext, StepLimits
from medusa_lite.trees.dynamic_tree import DynamicTree

# Children offered per expanded node, and nodes expanded per depth (EAGLE-2's top_k; it uses 10
# on a GPU, where rows are nearly free; on a CPU each row costs, so fewer, likelier ones).
DEFAULT_DRAFTING_TOPK = 4
# Most nodes a drafter adds per step (before any cost-based cut).
DEFAULT_DRAFTING_NODES = 12


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


def check_sizes_fit(model, config, what: str) -> None:
    """Raise :class:`IncompatibleHeadsError` unless ``config`` (a drafter's) has the target's hidden and vocab sizes;
    ``what`` names the drafter in the message ("the drafter", "the Hydra-style heads")."""
    hidden = model.base_model.get_input_embeddings().weight.shape[1]
    if config.hidden_size != hidden or config.vocab_size != model.vocab_size:
        raise IncompatibleHeadsError(
            f"{what}: made for hidden size {config.hidden_size} and vocab size {config.vocab_size}, but the model "
            f"has {hidden} and {model.vocab_size}: trained for another model ({config.base_model_name_or_path!r})"
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


@dataclass(frozen=True, kw_only=True)
class DraftingProposer(Proposer):
    """The settings of a drafter that grows its own tree each step; a kind's proposer adds its module as its one
        positional field (named by ``module_field``) and says in class variables how deep it drafts, how it is checked
    against a target and what one generation's run is.

        ``topk``: children offered per expanded node, and nodes expanded per depth. ``max_new_nodes``: most nodes a
        step adds. ``depth`` None: as deep as the module was trained to draft. ``costs``: the policy whose
        ``row_costs`` and ``tokens_per_cost`` size each step; None: ``model.tree`` when that is a
        :class:`DynamicTree`, else every step adds up to ``max_new_nodes``. ``draft_lm_head``: the target lm_head's
        rows of the module's draft vocabulary, gathered (and packed for few rows) once by ``load``; None: gathered
        per generation.
    """

    topk: int = DEFAULT_DRAFTING_TOPK
    max_new_nodes: int = DEFAULT_DRAFTING_NODES
    depth: int | None = None
    costs: DynamicTree | None = None
    draft_lm_head: DraftLMHead | None = None
    module_class: ClassVar[type]
    module_field: ClassVar[str]
    module_what: ClassVar[str]  # what errors call the module, e.g. "the heads"
    depth_setting: ClassVar[str]  # the module config's field of the depth it drafts when ``depth`` is None
    depth_is_fixed: ClassVar[bool]  # it cannot draft deeper than that (one head per depth)
    check_fits: ClassVar[Callable]  # (model, module): raise IncompatibleHeadsError when made for another target
    run_class: ClassVar[type]  # (proposer, model, costs) -> one generation's run, bound to the model

    @property
    def module(self) -> torch.nn.Module:
        return getattr(self, self.module_field)

    def __post_init__(self) -> None:
        owner, wanted = type(self).__name__, self.module_class
        if not isinstance(self.module, wanted):
            raise GenerationInputError(
                f"{owner} needs {wanted.__module__}.{wanted.__name__}, got {type(self.module).__name__}"
            )
        check_drafting_settings(owner, self.topk, self.max_new_nodes, self.depth, self.costs)
        deepest = self.trained_depth()
        if self.depth is not None and self.depth_is_fixed and self.depth > deepest:
            raise GenerationInputError(f"{owner}.depth {self.depth} is deeper than {self.module_what} ({deepest})")

    def trained_depth(self) -> int:
        """How deep the module drafts when ``depth`` is None."""
        return getattr(self.module.config, self.depth_setting)

    def draft_depth(self, max_depth: int | None) -> int:
        return depth_within(self.trained_depth() if self.depth is None else self.depth, max_depth)

    def max_nodes(self, limits: StepLimits) -> int:
        topk = min(self.topk, self.module.config.guess_vocab_size)
        return min(self.max_new_nodes, candidate_count_limit(topk, self.draft_depth(limits.max_depth)))

    def begin(self, model, prompt, limits):
        self.check_fits(model, self.module)
        costs = bind_to_target(self.module, model, self.costs)
        return self.run_class(self, model, None if costs is None else limits.batch_priced(costs))

    def propose(self, step: StepContext) -> Candidates | None:
        raise GenerationInputError(
            f"{type(self).__name__} is bound to a model per generation: generate() calls begin() first"
        )
