"""medusa-lite: exact Medusa-style speculative decoding for Hugging Face causal LMs."""

from medusa_lite.artifacts.loading import load
from medusa_lite.decoding.generate import GenerationOutput, GenerationStats, generate
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings, logits_to_probs
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.medusa.proposer import MedusaHeadsProposer
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
    "Datastore",
    "DatastoreError",
    "DraftVocabError",
    "DynamicTree",
    "GenerationInputError",
    "GenerationOutput",
    "GenerationStats",
    "HeadsConfigError",
    "HeadsFileError",
    "IncompatibleHeadsError",
    "MedusaConfig",
    "MedusaError",
    "MedusaHeads",
    "MedusaModel",
    "SamplingSettings",
    "Tree",
    "TreeError",
    "UnsupportedModelError",
    "best_tree",
    "Candidates",
    "DatastoreLookup",
    "DraftModelError",
    "DraftModelProposer",
    "FirstOf",
    "MedusaHeadsProposer",
    "PromptLookup",
    "Proposer",
    "ProposerError",
    "StepContext",
    "StepLimits",
    "StepOutcome",
    "TargetStates",
    "default_tree",
    "generate",
    "load",
    "LookaheadProposer",
    "SideRows",
    "logits_to_probs",
]
