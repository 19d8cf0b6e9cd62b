"""A Medusa-2 artifact on disk, built in a second: a tiny target, a LoRA adapter that changes it, heads.

``save_medusa2_artifact(folder)`` writes ``folder/model`` (a tiny llama + tokenizer) and
``folder/heads`` in the layout of :mod:`medusa_lite.artifacts.files` (``adapter/`` inside, the config's
``backbone_adapter`` set), as a Medusa-2 training run does; ``adapted_reference`` rebuilds the
adapted target the slow way (peft's unmerged ``PeftModel``), which ``load()`` must reproduce.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from tiny_models import random_heads, tiny_base_model
from tiny_tokenizer import make_tiny_tokenizer
from transformers import AutoModelForCausalLM

from medusa_lite.artifacts.files import ADAPTER_DIR
from medusa_lite.drafters.registry import kind_named
from medusa_lite.training.config import TrainConfig

NUM_HEADS = 3
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
# lora_B starts at zero (the adapter is then the identity); this scale makes it change the model clearly.
LORA_B_SCALE = 0.5


def save_medusa2_artifact(folder: Path, **base_overrides) -> tuple[Path, Path]:
    """(model folder, heads folder with ``adapter/``): a target, an adapter that changes it, heads."""
    tokenizer = make_tiny_tokenizer()
    base = tiny_base_model(
        vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, logit_scale=4.0, **base_overrides
    )
    base.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    heads = random_heads(base, NUM_HEADS)
    heads.config.backbone_adapter = True
    heads.config.base_model_name_or_path = str(folder / "model")
    heads.save_pretrained(folder / "heads")
    save_adapter(base, folder / "heads" / ADAPTER_DIR)
    return folder / "model", folder / "heads"


def save_adapter(base, adapter_dir: Path, seed: int = 5) -> None:
    """A LoRA adapter for ``base`` with random (non-zero) weights, saved as peft does."""
    adapted = get_peft_model(base, LoraConfig(**LORA))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * LORA_B_SCALE)
    adapted.save_pretrained(str(adapter_dir))
    adapted.unload()  # leave ``base`` as it was


def adapted_reference(model_dir: Path, heads_dir: Path):
    """The adapted target, unmerged (peft applies the LoRA at every forward): what the heads were trained on."""
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return PeftModel.from_pretrained(base, str(heads_dir / ADAPTER_DIR)).eval()


def plain_target(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def fresh_kind_folder(name: str, target, folder):
    """A built-in drafter kind's untrained artifact, jittered (seeded): its guesses neither all right nor alike."""
    artifact = kind_named(name).training.fresh(TrainConfig(data=["unused"], drafter=name, num_heads=3), target, None)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in artifact.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    artifact.save_pretrained(folder)
    return folder
