"""Trained drafters written in the formats serving engines load, and read back from them.

``medusa-lite export ARTIFACT --format vllm --out DIR`` (:mod:`medusa_lite.commands.export`) writes
Medusa heads as vLLM's Medusa loader reads them (:mod:`medusa_lite.export.vllm_medusa`) and, in
``DIR/export.json``, the ``speculative_config`` to pass. What a format cannot express is refused
by name (:func:`refusal`): SGLang serves no Medusa heads, and the EAGLE-3 layouts (vLLM, SGLang,
speculators) feed the feature and the token to a 2H-wide attention, which medusa-lite's
sequential drafter (one fusing layer before a plain decoder layer) and Hydra's heads do not compute.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.errors import ExportError
from medusa_lite.export import vllm_medusa

FORMATS = ("vllm", "sglang", "speculators")
EAGLE3_MISMATCH = (
    "EAGLE-3 feeds [embedding, feature] to a 2H-wide attention in its one decoder layer, which this drafter "
    "does not compute (it fuses them through one linear layer first)"
)


def refusal(drafter: object, format: str) -> str | None:
    """Why ``format`` cannot hold ``drafter`` (None: it can)."""
    if format not in FORMATS:
        return f"unknown export format {format!r}: choose one of {', '.join(FORMATS)}"
    medusa = isinstance(drafter, MedusaHeads)
    if format == "vllm":
        return None if medusa else f"vLLM's formats hold Medusa heads or EAGLE-3; {EAGLE3_MISMATCH}"
    if medusa:
        return (
            f"{format} has no Medusa format (SGLang serves EAGLE, EAGLE-3, MTP, n-gram and draft models; "
            "speculators holds EAGLE-3): export Medusa heads with --format vllm"
        )
    return f"{format} holds EAGLE-3 drafters; {EAGLE3_MISMATCH}"


def export_drafter(
    drafter: object,
    target_lm_head: nn.Module,
    out: str | Path,
    *,
    format: str = "vllm",
    target: str | None = None,
    token_map: bool = False,
) -> dict:
    """Write ``drafter`` into ``out`` in ``format``; returns what ``out/export.json`` holds (``token_map``:
    :func:`medusa_lite.export.vllm_medusa.export_heads`)."""
    reason = refusal(drafter, format)
    if reason is not None:
        raise ExportError(reason)
    return vllm_medusa.export_heads(drafter, target_lm_head, out, target=target, token_map=token_map)
