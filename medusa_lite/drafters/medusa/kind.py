"""Medusa heads as a drafter kind (:mod:`medusa_lite.drafters.registry`): decoded as a
:class:`~medusa_lite.decoding.model.MedusaModel`'s heads on a tree, trained alone or with the target
(Medusa-2)."""

from medusa_lite.drafters.contract import DrafterKind
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.medusa.training import MEDUSA_TRAINING

MEDUSA_HEADS = DrafterKind("medusa_heads", MedusaHeads, recorded_kind=None, training=MEDUSA_TRAINING)
