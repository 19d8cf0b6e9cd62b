"""Hydra-style heads as a drafter kind (:mod:`medusa_lite.drafters.registry`): a proposer growing trees
beside the lookups, each head reading its drafted path."""

from medusa_lite.drafters.contract import DrafterKind, Drafting
from medusa_lite.drafters.hydra.heads import HYDRA_KIND, HydraHeads
from medusa_lite.drafters.hydra.proposer import HydraProposer, check_hydra_fits, hydra_proposal
from medusa_lite.drafters.hydra.training import HYDRA_TRAINING

HYDRA_DRAFTING = Drafting(HydraProposer, check_hydra_fits, hydra_proposal)
HYDRA_HEADS = DrafterKind("hydra", HydraHeads, HYDRA_KIND, HYDRA_TRAINING, HYDRA_DRAFTING)
