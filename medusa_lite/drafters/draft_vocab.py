"""A drafter's draft vocabulary at decoding and training time: the target's lm_head restricted to the
D token ids the drafter guesses among (every kind's ``draft_token_ids``, :mod:`medusa_lite.artifacts.base`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.cpu.kernels import pack_for_row_gemm
from medusa_lite.cpu.prepack import packed_copy_applies, row_gemm_linear, weight_signature
from medusa_lite.errors import DraftVocabError


def draft_rows(base_lm_head: nn.Module, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The base lm_head's weight rows (and bias entries, if any) of ``token_ids``: a [D, H] copy."""
    weight = base_lm_head.weight.detach()
    token_ids = token_ids.to(weight.device)
    bias = getattr(base_lm_head, "bias", None)
    return weight[token_ids], None if bias is None else bias.detach()[token_ids]


class DraftLMHead(nn.Module):
    """The base lm_head restricted to a draft vocabulary, gathered once: logits [..., D].

    Its rows are derived data (a copy of D rows of the frozen base lm_head), so they live in
    non-persistent buffers: never saved, moved and cast with the module that owns them.
    :class:`~medusa_lite.decoding.model.MedusaModel` keeps one so that decoding does not gather D x H
    weights at every step.
    """

    def __init__(self, base_lm_head: nn.Module, token_ids: torch.Tensor):
        super().__init__()
        weight, bias = draft_rows(base_lm_head, token_ids)
        self.register_buffer("weight", weight, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        # A copy for the row_gemm kernel (pack_for_few_rows): plain attributes, never saved or moved.
        self.packed_weight: torch.Tensor | None = None
        self.packed_from: tuple | None = None
        self.packed_rows = 0

    def pack_for_few_rows(self, rows: int, dtype: torch.dtype = torch.float32) -> None:
        """Multiply inputs of up to ``rows`` rows (a step's heads) through medusa_lite's row_gemm kernel.

        The heads' few rows then read the D x H weights once, at the kernel's speed (PyTorch's own
        few-row float32 product is slow on some CPUs: docs/results.md, "Measurements behind the code's
        choices").
        Float32 CPU weights only; the packed copy is used only while the weights are the very
        tensor, version, dtype and device it was packed from (else the usual path, as
        :class:`~medusa_lite.cpu.prepack.PrepackedLinear`). ``dtype`` bfloat16: a packed copy of half the
        bytes (:func:`~medusa_lite.cpu.kernels.pack_for_row_gemm`), for guesses that need not match float32's.
        """
        self.packed_weight = pack_for_row_gemm(self.weight, dtype=dtype)
        self.packed_from, self.packed_rows = weight_signature(self.weight), rows

    def packed_path_applies(self, hidden: torch.Tensor) -> bool:
        return self.packed_weight is not None and packed_copy_applies(
            self.weight, self.packed_from, hidden, 1, self.packed_rows
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_path_applies(hidden):
            return row_gemm_linear(hidden, self.packed_weight, self.weight.shape[0], self.bias)
        return F.linear(hidden, self.weight, self.bias)


def guess_logits(
    hidden: torch.Tensor, base_lm_head: nn.Module, draft_token_ids: torch.Tensor | None, what: str
) -> torch.Tensor:
    """Output features [..., H] of a drafter that reuses the target's lm_head -> logits [..., G].

    G: the draft vocabulary's size (``draft_token_ids``), else V. ``base_lm_head``: the target's
    output layer (the draft rows are then gathered for this call, as training does), or a
    :class:`DraftLMHead` gathered once from these ids (what decoding passes). ``what`` names the
    drafter in errors.
    """
    if isinstance(base_lm_head, DraftLMHead):
        if draft_token_ids is None or base_lm_head.weight.shape[0] != draft_token_ids.numel():
            size = None if draft_token_ids is None else draft_token_ids.numel()
            raise DraftVocabError(
                f"a DraftLMHead of {base_lm_head.weight.shape[0]} rows does not fit a {what} whose draft "
                f"vocabulary size is {size}"
            )
        return base_lm_head(hidden.to(base_lm_head.weight.dtype))
    if draft_token_ids is not None:
        weight, bias = draft_rows(base_lm_head, draft_token_ids)
        return F.linear(hidden.to(weight.dtype), weight, bias)
    return base_lm_head(hidden.to(base_lm_head.weight.dtype))
