"""Training hooks of Medusa heads: fresh heads for a target, and their objective (heads alone, or Medusa-2:
the heads with a LoRA adapter on the target)."""

from __future__ import annotations

from medusa_lite.decoding.model import MedusaModel
from medusa_lite.drafters.contract import Training
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.extras import require_extra
from medusa_lite.training.errors import TrainingConfigError
from medusa_lite.training.objective import HeadsObjective, LossSettings, Medusa2Objective


def fresh_medusa_heads(config, base_model, draft_token_ids) -> MedusaHeads:
    """``config.num_heads`` fresh heads sized for ``base_model`` (``config``: the run's TrainConfig)."""
    return MedusaModel.with_new_heads(
        base_model,
        config.num_heads,
        num_layers=config.num_layers,
        use_base_lm_head=config.use_base_lm_head,
        draft_token_ids=draft_token_ids,
        next_token_input=config.next_token_input,
    ).heads


def add_lora(lora, base_model):
    """``base_model`` with a LoRA adapter as a config's ``lora:`` section describes it (a peft model)."""
    require_extra("peft", "Training with a lora: section (Medusa-2)")
    from peft import LoraConfig, get_peft_model

    lora_config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(base_model, lora_config)
    except ValueError as error:
        raise TrainingConfigError(
            f"lora.target_modules {lora.target_modules} do not fit the model: {error}"
        ) from error


def medusa_objective(config, base_model, heads: MedusaHeads, settings: LossSettings):
    """The heads' objective, and the model training batches are read with (the adapted one for Medusa-2)."""
    if config.lora is None:
        return HeadsObjective(
            heads, base_model.get_output_embeddings(), settings, base_model.get_input_embeddings()
        ), base_model
    peft_model = add_lora(config.lora, base_model)
    return Medusa2Objective(peft_model, heads, settings, config.lora.distill_weight), peft_model


def describe_medusa_heads(config) -> str:
    return f"{config.num_heads} heads ({'Medusa-2: heads + LoRA' if config.lora is not None else 'heads only'})"


MEDUSA_TRAINING = Training(
    fresh_medusa_heads, medusa_objective, describe_medusa_heads, unit="head", trains_target=True
)
