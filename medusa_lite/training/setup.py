"""Loading the frozen target, attaching fresh heads (and LoRA), creating the Accelerator."""

from __future__ import annotations

import contextlib
import os

import torch

from medusa_lite.artifacts.loading import load_target
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.registry import kind_named
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.dtypes import AUTO, parse_dtype
from medusa_lite.extras import require_extra
from medusa_lite.training.checks import check_processes_connected
from medusa_lite.training.config import DEFAULT_MODEL_KEYWORD, TrainConfig
from medusa_lite.training.drafter_objective import state_layers
from medusa_lite.training.errors import TrainingConfigError
from medusa_lite.training.objective import LossSettings


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
        # CPUs without bfloat16 matrix instructions run batched float32 matmuls faster than bfloat16
        # ones (docs/results.md, "Measurements behind the code's choices"); the upcast weights are
        # exactly the stored (e.g. bf16) ones, so the features match inference closely. With AMX or
        # AVX512-BF16 bfloat16 is the fast one (docs/training.md).
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
    """A fresh drafter of the kind ``config.drafter`` names (:mod:`medusa_lite.drafters.registry`) for
    ``base_model``, in float32 (the master weights whatever the target's dtype); with ``draft_token_ids`` it
    guesses among those tokens only."""
    module = kind_named(config.drafter).training.fresh(config, base_model, draft_token_ids)
    if config.model == DEFAULT_MODEL_KEYWORD:
        from medusa_lite.artifacts.default_model import DEFAULT_MODEL_NAME

        module.config.base_model_name_or_path = DEFAULT_MODEL_NAME
    return module.float()


def loss_settings(config: TrainConfig) -> LossSettings:
    return LossSettings(
        weights=config.loss_weights(),
        distill_weight=config.distill_weight,
        chunk_size=config.loss_chunk_positions,
        feature_weight=config.feature_weight,
    )


def batch_layers(config: TrainConfig) -> list[int] | None:
    """The target layers each training batch holds per position (None: the final hidden state alone)."""
    if not kind_named(config.drafter).training.unrolled:
        return None
    return state_layers(config.feature_layers, loss_settings(config).reads_target_ahead)


def build_objective(config: TrainConfig, base_model, heads: MedusaHeads | SequentialDrafter | HydraHeads):
    """The objective ``accelerator.prepare`` gets for ``heads`` (its kind's), and the model batches are read
    with."""
    return kind_named(config.drafter).training.objective(config, base_model, heads, loss_settings(config))


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
