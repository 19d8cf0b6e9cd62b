"""What a measurement needs: the chat prompt's ids, plain ``model.generate`` as the baseline, wall time, the machine.

Shared by the ``medusa-lite`` commands (``generate --compare``, ``benchmark``, ``calibrate``) and the
scripts in ``infer/``.
"""

from __future__ import annotations

import datetime
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers

from medusa_lite.cpu.kernels import cpu_capability, kernel_path
from medusa_lite.cpu.prepack import prepack_backend, prepacked_rows
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.dtypes import dtype_name


def chat_input_ids(tokenizer, prompt: str, *, raw: bool = False) -> torch.Tensor:
    """Token ids [1, L] of a one-turn chat (the tokenizer's template), or of ``prompt`` as is."""
    if raw or not getattr(tokenizer, "chat_template", None):
        return tokenizer(prompt, return_tensors="pt").input_ids
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids


def left_padded(prompts: list[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, L], attention_mask [B, L]) of 1-D prompts, left-padded as a tokenizer with
    ``padding_side="left"`` pads them (a batch for ``generate``)."""
    width = max(prompt.numel() for prompt in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - prompt.numel() :], mask[row, width - prompt.numel() :] = prompt, 1
    return ids, mask


def plain_generate(
    base_model, input_ids: torch.Tensor, max_new_tokens: int, settings: SamplingSettings, **extra
) -> torch.Tensor:
    """New tokens [n] of plain ``model.generate`` with the same sampling settings as medusa-lite."""
    sampling = {"do_sample": False}
    if not settings.greedy:
        sampling = {
            "do_sample": True,
            "temperature": settings.temperature,
            "top_k": settings.top_k or 0,
            "top_p": settings.top_p or 1.0,
        }
    pad = base_model.generation_config.pad_token_id
    eos = base_model.generation_config.eos_token_id
    out = base_model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        pad_token_id=pad if pad is not None else eos if isinstance(eos, int) else 0,
        **sampling,
        **extra,
    )
    return out[0, input_ids.shape[1] :]


def timed(function: Callable[[], object]) -> tuple[object, float]:
    """(result, seconds of wall time)."""
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


@dataclass
class TimedRun:
    """The new tokens of one generation and the wall time it took."""

    tokens: torch.Tensor
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens.numel() / self.seconds if self.seconds else 0.0


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(dtype: torch.dtype, model: torch.nn.Module | None = None) -> dict:
    """Where and how a measurement ran, to store next to it; with ``model``, also its ``prepacked_rows``."""
    info = {
        "cpu": cpu_model(),
        "cpu_capability": cpu_capability(),
        "kernel": kernel_path().as_dict(),
        "torch_threads": torch.get_num_threads(),
        "dtype": dtype_name(dtype),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if model is not None:
        info["prepacked_rows"] = prepacked_rows(model)  # None: linear weights not pre-packed
        info["prepack_backend"] = prepack_backend(model)
    return info


# A random llama small enough for a CPU test run and large enough that a verification of many rows costs
# more than one (microbench's default target, gpu-check's exactness runs).
TINY_LLAMA = dict(
    vocab_size=512,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)


def tiny_llama(dtype: torch.dtype, seed: int, attn_implementation: str = "sdpa", device: str = "cpu"):
    """A random :data:`TINY_LLAMA` causal LM in eval mode, without special tokens (pad id 0 for ``generate``)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_LLAMA, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    model.generation_config.pad_token_id = 0
    return model.to(device).eval()
