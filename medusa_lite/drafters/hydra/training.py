"""Training hooks of Hydra-style heads: fresh heads for a target, and their objective."""

from __future__ import annotations

import torch

from medusa_lite.drafters.contract import Training
from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
from medusa_lite.training.objective import HeadsObjective, LossSettings


def fresh_hydra_heads(config, base_model, draft_token_ids) -> HydraHeads:
    """``config.num_heads`` fresh Hydra-style heads for ``base_model``, each reading its drafted path."""
    heads = HydraHeads(
        HydraConfig(
            num_heads=config.num_heads,
            hidden_size=base_model.get_input_embeddings().weight.shape[1],
            vocab_size=base_model.get_output_embeddings().weight.shape[0],
            draft_vocab_size=None if draft_token_ids is None else int(torch.as_tensor(draft_token_ids).numel()),
            base_model_name_or_path=getattr(base_model.config, "_name_or_path", None) or None,
        )
    )
    if draft_token_ids is not None:
        heads.set_draft_vocab(draft_token_ids)
    return heads


def hydra_objective(config, base_model, heads: HydraHeads, settings: LossSettings):
    """The heads' objective (they read the target's input embeddings of their path), and the model batches are
    read with."""
    return HeadsObjective(
        heads, base_model.get_output_embeddings(), settings, base_model.get_input_embeddings()
    ), base_model


def describe_hydra_heads(config) -> str:
    return f"{config.num_heads} Hydra-style heads"


HYDRA_TRAINING = Training(fresh_hydra_heads, hydra_objective, describe_hydra_heads, unit="depth")
