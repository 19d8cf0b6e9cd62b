"""The drafter contract: what a kind of drafter tells ``load()``, training, push and the CLI about itself.

Each kind's folder (``medusa_lite/drafters/<kind>/kind.py``) fills one :class:`DrafterKind`;
:mod:`medusa_lite.drafters.registry` holds them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Drafting:
    """How ``load()`` serves a drafter that grows its own trees, as a proposer beside the lookups.

    ``proposer(artifact, topk=..., max_new_nodes=...)``: its proposer (a dataclass with ``costs`` and
    ``draft_lm_head`` fields and ``packed_rows()``); ``check_fits(model, artifact)``: raise
    :class:`~medusa_lite.errors.IncompatibleHeadsError` when it was made for another target;
    ``proposal(proposer, model)``: what calibration times as its work per step
    (:class:`~medusa_lite.trees.costs.Proposal`).
    """

    proposer: Callable[..., Any]
    check_fits: Callable[[Any, Any], None]
    proposal: Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Training:
    """How medusa-lite trains a kind.

    ``fresh(config, base_model, draft_token_ids)``: an untrained one for a target, from the run's
    :class:`~medusa_lite.training.config.TrainConfig`; ``objective(config, base_model, artifact,
    loss_settings)``: ``(objective, model the batches are read with)``; ``describe(config)``: what a
    run trains, in words. ``unit``: what its accuracy is reported per ("head" or "depth").
    ``trains_target``: it may be trained jointly with the target (Medusa-2's LoRA) and with its own
    lm_head; else it reuses the target's. ``unrolled``: it is trained unrolled over its own draft
    from every position, reading the target's layers (``feature_layers``, ``feature_weight``).
    """

    fresh: Callable[..., Any]
    objective: Callable[..., tuple[Any, Any]]
    describe: Callable[[Any], str]
    unit: str = "head"
    trains_target: bool = False
    unrolled: bool = False


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter.

    ``name``: what a training config's ``drafter:`` calls it. ``artifact``: its module class (a
    :class:`~medusa_lite.artifacts.base.StrictArtifact` with ``config_class``). ``recorded_kind``: the
    ``kind`` its ``config.json`` records (None: Medusa heads, whose configs predate kinds).
    ``training``: how it is trained (None: medusa-lite decodes it but does not train it; a training
    config naming it is refused). ``drafting``: how ``load()`` serves it (None: the heads of a
    :class:`MedusaModel`, on a tree).
    """

    name: str
    artifact: type
    recorded_kind: str | None
    training: Training | None = None
    drafting: Drafting | None = None
