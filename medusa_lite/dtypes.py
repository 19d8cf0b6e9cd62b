"""The one dtype vocabulary: the names every ``--dtype`` option and the training config's ``dtype`` accept.

A dtype is written by torch's own name (``"bfloat16"``); the short forms ``bf16``, ``fp32`` and
``fp16`` mean the same; ``"auto"`` leaves the choice to the device (float32 on a CPU, bfloat16
on an accelerator: :func:`medusa_lite.artifacts.loading.default_dtype`).
"""

from __future__ import annotations

import torch

from medusa_lite.errors import MedusaError

AUTO = "auto"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
EXPLICIT_DTYPE_CHOICES = (*SHORT_NAMES, *DTYPES)
DTYPE_CHOICES = (AUTO, *EXPLICIT_DTYPE_CHOICES)


class DtypeError(MedusaError, ValueError):
    """A dtype name outside the vocabulary."""


def parse_dtype(name: str) -> torch.dtype | None:
    """``"bf16"`` or ``"bfloat16"`` -> ``torch.bfloat16``; ``"auto"`` -> None (the device decides)."""
    if name == AUTO:
        return None
    full_name = SHORT_NAMES.get(name, name)
    if full_name not in DTYPES:
        raise DtypeError(f"unknown dtype {name!r}: use one of {', '.join(DTYPE_CHOICES)}")
    return DTYPES[full_name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: how results, settings and cache folders write a dtype."""
    return str(dtype).removeprefix("torch.")
