"""The sequential drafter as a drafter kind (:mod:`medusa_lite.drafters.registry`): a proposer growing trees
beside the lookups with its own cache, trained unrolled over its own draft."""

from medusa_lite.drafters.contract import DrafterKind, Drafting
from medusa_lite.drafters.sequential.drafter import DRAFTER_KIND, SequentialDrafter
from medusa_lite.drafters.sequential.proposer import SequentialDrafterProposer, check_drafter_fits, drafter_proposal
from medusa_lite.drafters.sequential.training import SEQUENTIAL_TRAINING

SEQUENTIAL_DRAFTING = Drafting(SequentialDrafterProposer, check_drafter_fits, drafter_proposal)
SEQUENTIAL_DRAFTER = DrafterKind(
    "sequential", SequentialDrafter, DRAFTER_KIND, SEQUENTIAL_TRAINING, SEQUENTIAL_DRAFTING
)
