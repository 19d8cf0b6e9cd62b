"""Loading the frozen target, attaching fresh heads (and LoRA), creating the Accelerator."""

from __future__ import annotations

import contextlib
import os

import torch

from medusa_lite.artifacts.loading import load_target
from medusa_lite.decoding.model import MedusaModel, hidden_state_count
from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.dtypes import AUTO, parse_dtype
from medusa_lite.extras import require_extra
from medusa_lite.training.checks import check_processes_connected
from medusa_lite.training.config import DEFAULT_MODEL_KEYWORD, TrainConfig
from medusa_lite.training.drafter_objective import DrafterObjective, state_layers
from medusa_lite.training.errors import TrainingConfigError
from medusa_lite.training.objective import HeadsObjective, LossSettings, Medusa2Objective


def resolve_dtype(config: TrainConfig):
    if config.dtype != AUTO:
        return parse_dtype(config.dtype)
    return torch.bfloat16 if config.model == DEFAULT_MODEL_KEYWORD else "auto"


def load_frozen_target(config: TrainConfig, accelerator):
    """The frozen target and its tokenizer (never partitioned by ZeRO-3: it lives outside the engine)."""
    name = None if config.model == DEFAULT_MODEL_KEYWORD else config.model
    with without_zero3_init(accelerator):
        with accelerator.main_process_first():  # the default model is converted once, by rank 0
            try:
                model, tokenizer = load_target(
                    name, resolve_dtype(config), "cpu", attn_implementation=config.attn_implementation
                )
            except OSError as error:
                raise TrainingConfigError(f"could not load the target model {config.model!r}: {error}") from error
    model.requires_grad_(False)
    if (
        config.dtype == AUTO
        and accelerator.device.type == "cpu"
        and model.dtype != torch.float32
        and not has_bf16_matrix_units()
    ):
        # CPUs without bfloat16 matrix instructions run batched float32 matmuls ~2-3x faster than
        # bfloat16 ones; the upcast weights are exactly the stored (e.g. bf16) ones, so the features
        # match inference closely. With AMX or AVX512-BF16 bfloat16 is the fast one (docs/training.md).
        model = model.float()
    return model.to(accelerator.device), tokenizer


def has_bf16_matrix_units() -> bool:
    """Whether this CPU multiplies bfloat16 matrices natively (AMX tiles or AVX512-BF16): then bfloat16 is its fast
    dtype.
    """
    probes = (getattr(torch.cpu, name, None) for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
    return any(bool(probe()) for probe in probes if probe is not None)


@contextlib.contextmanager
def without_zero3_init(accelerator):
    """Load the frozen target whole on every rank, even under ZeRO-3.

    With a ZeRO-3 DeepSpeed config active, transformers' ``from_pretrained`` partitions the
    weights (a collective call, which would also deadlock inside ``main_process_first``). The
    target is not trained and stays outside the DeepSpeed engine, so it must be loaded whole.
    """
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or plugin.zero_stage != 3:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def check_draft_vocab_fits(config: TrainConfig, vocab_size: int) -> None:
    """The one draft vocabulary check that needs the model: D cannot exceed its vocabulary."""
    if config.draft_vocab_size is not None and config.draft_vocab_size > vocab_size:
        raise TrainingConfigError(
            f"config: draft_vocab_size {config.draft_vocab_size} exceeds the model's vocabulary of "
            f"{vocab_size} tokens; lower it or set it to null"
        )


def fresh_heads(
    config: TrainConfig, base_model, draft_token_ids: torch.Tensor | None = None
) -> MedusaHeads | SequentialDrafter | HydraHeads:
    """Fresh heads (or a sequential drafter, or Hydra-style heads, per ``config.drafter``) for ``base_model``; with
    ``draft_token_ids`` they guess among those tokens only."""
    if config.drafter == "sequential":
        return fresh_drafter(config, base_model, draft_token_ids)
    if config.drafter == "hydra":
        return fresh_hydra_heads(config, base_model, draft_token_ids)
    heads = MedusaModel.with_new_heads(
        base_model,
        config.num_heads,
        num_layers=config.num_layers,
        use_base_lm_head=config.use_base_lm_head,
        draft_token_ids=draft_token_ids,
        next_token_input=config.next_token_input,
    ).heads
    if config.model == DEFAULT_MODEL_KEYWORD:
        from medusa_lite.artifacts.default_model import DEFAULT_MODEL_NAME

        heads.config.base_model_name_or_path = DEFAULT_MODEL_NAME
    return heads.float()  # float32 master weights whatever the target's dtype


def fresh_hydra_heads(config: TrainConfig, base_model, draft_token_ids: torch.Tensor | None) -> HydraHeads:
    """Fresh Hydra-style heads for ``base_model``: ``config.num_heads`` heads, each reading its drafted path."""
    hydra_config = HydraConfig(
        num_heads=config.num_heads,
        hidden_size=base_model.get_input_embeddings().weight.shape[1],
        vocab_size=base_model.get_output_embeddings().weight.shape[0],
        draft_vocab_size=None if draft_token_ids is None else int(torch.as_tensor(draft_token_ids).numel()),
        base_model_name_or_path=getattr(base_model.config, "_name_or_path", None) or None,
    )
    if config.model == DEFAULT_MODEL_KEYWORD:
        from medusa_lite.artifacts.default_model import DEFAULT_MODEL_NAME

        hydra_config.base_model_name_or_path = DEFAULT_MODEL_NAME
    heads = HydraHeads(hydra_config)
    if draft_token_ids is not None:
        heads.set_draft_vocab(draft_token_ids)
    return heads.float()


def fresh_drafter(config: TrainConfig, base_model, draft_token_ids: torch.Tensor | None) -> SequentialDrafter:
    """A fresh sequential drafter sized like ``base_model``'s layers, unrolled ``config.num_heads`` depths."""
    draft_size = None if draft_token_ids is None else int(torch.as_tensor(draft_token_ids).numel())
    states = hidden_state_count(base_model)
    if config.feature_layers is not None and max(config.feature_layers) >= states:
        raise TrainingConfigError(
            f"config: feature_layers {config.feature_layers} name hidden states the model does not have: it has "
            f"{states} (0: the embeddings, 1..{states - 1}: its decoder layers' outputs)"
        )
    drafter_config = DrafterConfig.for_model(
        base_model, depth=config.num_heads, draft_vocab_size=draft_size, feature_layers=config.feature_layers
    )
    if config.model == DEFAULT_MODEL_KEYWORD:
        from medusa_lite.artifacts.default_model import DEFAULT_MODEL_NAME

        drafter_config.base_model_name_or_path = DEFAULT_MODEL_NAME
    drafter = SequentialDrafter(drafter_config)
    if draft_token_ids is not None:
        drafter.set_draft_vocab(draft_token_ids)
    return drafter.float()


def add_lora(config: TrainConfig, base_model):
    require_extra("peft", "Training with a lora: section (Medusa-2)")
    from peft import LoraConfig, get_peft_model

    settings = config.lora
    lora_config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(base_model, lora_config)
    except ValueError as error:
        raise TrainingConfigError(
            f"lora.target_modules {settings.target_modules} do not fit the model: {error}"
        ) from error


def loss_settings(config: TrainConfig) -> LossSettings:
    return LossSettings(
        weights=config.loss_weights(),
        distill_weight=config.distill_weight,
        chunk_size=config.loss_chunk_positions,
        feature_weight=config.feature_weight,
    )


def batch_layers(config: TrainConfig) -> list[int] | None:
    """The target layers each training batch holds per position (None: the final hidden state alone)."""
    if config.drafter != "sequential":
        return None
    return state_layers(config.feature_layers, loss_settings(config).reads_target_ahead)


def build_objective(config: TrainConfig, base_model, heads: MedusaHeads | SequentialDrafter | HydraHeads):
    settings = loss_settings(config)
    if isinstance(heads, SequentialDrafter):
        return DrafterObjective(
            heads, base_model.get_output_embeddings(), base_model.get_input_embeddings(), settings
        ), base_model
    if config.lora is None:
        return HeadsObjective(
            heads, base_model.get_output_embeddings(), settings, base_model.get_input_embeddings()
        ), base_model
    peft_model = add_lora(config, base_model)
    return Medusa2Objective(peft_model, heads, settings, config.lora.distill_weight), peft_model


def needs_gloo() -> bool:
    """CPU-only distributed runs (incl. DeepSpeed, which would ask for NCCL) need the gloo backend."""
    distributed = (
        int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    )
    return distributed and not torch.cuda.is_available()


def make_accelerator(config: TrainConfig):
    require_extra("accelerate", "Training heads")
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, ProjectConfiguration

    handlers = [InitProcessGroupKwargs(backend="gloo")] if needs_gloo() else []
    accelerator = Accelerator(
        mixed_precision=config.mixed_precision,
        log_with="wandb" if config.wandb is not None else None,
        project_config=ProjectConfiguration(project_dir=config.output_dir, automatic_checkpoint_naming=False),
        kwargs_handlers=handlers,
    )
    check_processes_connected(accelerator)
    return accelerator


def fill_deepspeed_config(accelerator, config: TrainConfig) -> None:
    """No dataloader goes through ``prepare``, so DeepSpeed's batch-size keys are set here."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = config.batch_size
    ds["gradient_accumulation_steps"] = 1
    ds["train_batch_size"] = config.batch_size * accelerator.num_processes
    if ds.get("gradient_clipping", "auto") == "auto":
        ds["gradient_clipping"] = config.max_grad_norm


def is_zero3(accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and plugin.zero_stage == 3
