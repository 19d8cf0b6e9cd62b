"""medusa-lite: exact Medusa-style speculative decoding for Hugging Face causal LMs.

The public API is what ``__all__`` names: ``load`` and ``generate``, the target wrapper, every drafter kind
(its module, config and proposer) and the registry a new kind joins, the untrained proposers, trees, and the
errors. Everything else (a subpackage's other names) is internal and may change between releases.
"""

from medusa_lite.artifacts.loading import attach, load
from medusa_lite.decoding.generate import GenerationOutput, GenerationStats, generate
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings, logits_to_probs
from medusa_lite.drafters.contract import DrafterKind, Drafting, Training
from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
from medusa_lite.drafters.hydra.proposer import HydraProposer
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.medusa.proposer import MedusaHeadsProposer
from medusa_lite.drafters.registry import register
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.drafters.sequential.proposer import SequentialDrafterProposer
from medusa_lite.errors import (
    AdapterError,
    ArtifactNotFoundError,
    DraftVocabError,
    GenerationInputError,
    HeadsConfigError,
    HeadsFileError,
    IncompatibleHeadsError,
    MedusaError,
    TreeError,
    UnsupportedModelError,
)
from medusa_lite.proposers.base import (
    Candidates,
    FirstOf,
    Proposer,
    ProposerError,
    SideRows,
    StepContext,
    StepLimits,
    StepOutcome,
    TargetStates,
)
from medusa_lite.proposers.datastore import Datastore, DatastoreError
from medusa_lite.proposers.draft_model import DraftModelError, DraftModelProposer
from medusa_lite.proposers.lookahead import LookaheadProposer
from medusa_lite.proposers.lookup import DatastoreLookup, PromptLookup
from medusa_lite.trees.dynamic_tree import DynamicTree
from medusa_lite.trees.tree import Tree, best_tree, default_tree

__all__ = [
    "AdapterError",
    "ArtifactNotFoundError",
    "Candidates",
    "Datastore",
    "DatastoreError",
    "DatastoreLookup",
    "DraftModelError",
    "DraftModelProposer",
    "DraftVocabError",
    "DrafterConfig",
    "DrafterKind",
    "Drafting",
    "DynamicTree",
    "FirstOf",
    "GenerationInputError",
    "GenerationOutput",
    "GenerationStats",
    "HeadsConfigError",
    "HeadsFileError",
    "HydraConfig",
    "HydraHeads",
    "HydraProposer",
    "IncompatibleHeadsError",
    "LookaheadProposer",
    "MedusaConfig",
    "MedusaError",
    "MedusaHeads",
    "MedusaHeadsProposer",
    "MedusaModel",
    "PromptLookup",
    "Proposer",
    "ProposerError",
    "SamplingSettings",
    "SequentialDrafter",
    "SequentialDrafterProposer",
    "SideRows",
    "StepContext",
    "StepLimits",
    "StepOutcome",
    "TargetStates",
    "Training",
    "Tree",
    "TreeError",
    "UnsupportedModelError",
    "attach",
    "best_tree",
    "default_tree",
    "generate",
    "load",
    "logits_to_probs",
    "register",
]
