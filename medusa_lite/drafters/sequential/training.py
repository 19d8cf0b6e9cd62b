"""Training hooks of the sequential drafter: a fresh drafter for a target, and its unrolled objective."""

from __future__ import annotations

import torch

from medusa_lite.decoding.model import hidden_state_count
from medusa_lite.drafters.contract import Training
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.training.drafter_objective import DrafterObjective
from medusa_lite.training.errors import TrainingConfigError
from medusa_lite.training.objective import LossSettings


def fresh_sequential_drafter(config, base_model, draft_token_ids) -> SequentialDrafter:
    """A fresh sequential drafter sized like ``base_model``'s layers, unrolled ``config.num_heads`` depths,
    reading the target layers ``config.feature_layers`` names (None: its default)."""
    states = hidden_state_count(base_model)
    if config.feature_layers is not None and max(config.feature_layers) >= states:
        raise TrainingConfigError(
            f"config: feature_layers {config.feature_layers} name hidden states the model does not have: it has "
            f"{states} (0: the embeddings, 1..{states - 1}: its decoder layers' outputs)"
        )
    drafter = SequentialDrafter(
        DrafterConfig.for_model(
            base_model,
            depth=config.num_heads,
            draft_vocab_size=None if draft_token_ids is None else int(torch.as_tensor(draft_token_ids).numel()),
            feature_layers=config.feature_layers,
        )
    )
    if draft_token_ids is not None:
        drafter.set_draft_vocab(draft_token_ids)
    return drafter


def sequential_objective(config, base_model, drafter: SequentialDrafter, settings: LossSettings):
    """The drafter's unrolled objective, and the model batches are read with."""
    return DrafterObjective(
        drafter, base_model.get_output_embeddings(), base_model.get_input_embeddings(), settings
    ), base_model


def describe_sequential_drafter(config) -> str:
    return f"a sequential drafter ({config.num_heads} depths)"


SEQUENTIAL_TRAINING = Training(
    fresh_sequential_drafter, sequential_objective, describe_sequential_drafter, unit="depth", unrolled=True
)
