"""Cheaper tree verification on CPU: linear weights pre-packed for MKL's small-batch GEMM.

Verifying a tree multiplies every weight matrix of the target by a handful of rows (one per
node). On CPU, PyTorch's float32 linear for 4-16 rows re-packs the weight matrix on every call, so
that a step over 8 nodes costs about twice a one-token step, most of the extra in the GEMMs. MKL
can pack a weight once for a fixed row count (``torch.ops.mkl._mkl_reorder_linear_weight``, the op
TorchInductor's freezing pass uses) and multiply by the packed copy afterwards.

:func:`prepack_linears` swaps every ``nn.Linear`` of a target for a :class:`PrepackedLinear`
sharing its parameters: inputs of ``MIN_PREPACKED_ROWS`` to ``rows`` rows are zero-padded to
``rows`` and multiplied by the packed weight; every other input (one-token decoding, prefills
longer than ``rows``) takes the usual path, bit for bit. The model's parameters and
``state_dict`` are unchanged (the packed copy is not a buffer, and is ignored once the weight
changes: see :class:`PrepackedLinear`).
:func:`medusa_lite.load` packs the target for its tree plus the default prompt-lookup chain
unless ``prepack=False``.

Measured (SmolLM2-135M, float32, 2-core Xeon, 2 threads, 200-token cached prefix; decoding step
relative to a one-token step, same process, interleaved): 8 nodes 1.80 -> 1.55, 16 nodes 2.03 ->
1.75; 4 nodes packed for exactly 4 rows 1.62 -> 1.37. The packed copies cost memory (about 1 GB
for this model per row count) and only float32 on CPU is supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.errors import UnsupportedModelError

# Below this many rows MKL's own float32 path is as fast as a packed weight (measured above:
# 2 and 3 nodes cost 1.14x and 1.18-1.28x a one-token step either way).
MIN_PREPACKED_ROWS = 4


def mkl_packing_available() -> bool:
    """Whether this PyTorch build has MKL's packed linear ops."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def prepack_unsupported_reason(model: nn.Module) -> str | None:
    """Why :func:`prepack_linears` does not apply to ``model`` (None when it does: float32 on CPU, MKL)."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return "the model has no parameters"
    if parameter.device.type != "cpu":
        return f"the model is on {parameter.device}, not on the CPU"
    if parameter.dtype != torch.float32:
        return f"the model's weights are {str(parameter.dtype).removeprefix('torch.')}, not float32"
    if not mkl_packing_available():
        return "this PyTorch build has no MKL packed linear ops"
    return None


def prepack_supported(model: nn.Module) -> bool:
    """Whether :func:`prepack_linears` applies to ``model``: float32 weights on CPU with MKL."""
    return prepack_unsupported_reason(model) is None


def check_prepack_supported(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError`, saying why, unless :func:`prepack_supported`."""
    reason = prepack_unsupported_reason(model)
    if reason is not None:
        raise UnsupportedModelError(f"cannot pre-pack linear weights: {reason} (pre-packing needs float32 weights on CPU and a PyTorch built with MKL)")


def rows_of(inputs: torch.Tensor) -> int:
    """How many rows a linear layer multiplies for ``inputs`` [..., in_features]."""
    return inputs.numel() // inputs.shape[-1] if inputs.shape[-1] else 0


def weight_signature(weight: torch.Tensor) -> tuple:
    """What identifies the values a packed copy was made from: storage, in-place version, dtype, device."""
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device)


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` (the same parameters) that multiplies MKL-packable inputs by a packed copy.

    The packed copy is a plain attribute, not a buffer: ``.to()``/``.half()`` never convert it,
    and it is used only while the weight is the very tensor, version, dtype and device it was
    packed from. After any change to the weight (loading, in-place updates, a dtype or device
    move) every input takes the usual path: still correct, no longer faster (pack again).
    """

    def __init__(self, linear: nn.Linear, rows: int):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.rows = rows
        self.packed_weight = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), rows)
        self.packed_from = weight_signature(linear.weight)

    def packed_path_applies(self, rows: int) -> bool:
        return MIN_PREPACKED_ROWS <= rows <= self.rows and not torch.is_grad_enabled() and weight_signature(self.weight) == self.packed_from

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = rows_of(inputs)
        if not self.packed_path_applies(rows) or inputs.dtype != self.weight.dtype:
            return F.linear(inputs, self.weight, self.bias)
        flat = inputs.reshape(rows, self.in_features)
        padded = F.pad(flat, (0, 0, 0, self.rows - rows))
        output = torch.ops.mkl._mkl_linear(padded, self.packed_weight, self.weight, self.bias, self.rows)
        return output[:rows].reshape(*inputs.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, packed_rows={self.rows}"


def unpacked(linear: nn.Linear) -> nn.Linear:
    """A plain ``nn.Linear`` with the parameters of ``linear`` (itself when it is one)."""
    if type(linear) is nn.Linear:
        return linear
    plain = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    plain.weight, plain.bias = linear.weight, linear.bias
    return plain


def linear_children(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute name, layer) of every ``nn.Linear`` (prepacked or not) in ``model``."""
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) in (nn.Linear, PrepackedLinear)
    ]


def prepack_linears(model: nn.Module, rows: int) -> int:
    """Pack every linear layer of ``model`` for ``rows``-row inputs, in place; returns how many.

    Packing again replaces earlier packed copies; ``rows < MIN_PREPACKED_ROWS`` unpacks. Raises
    :class:`~medusa_lite.errors.UnsupportedModelError` (a ``ValueError``) unless :func:`prepack_supported`.
    """
    if rows >= MIN_PREPACKED_ROWS:
        check_prepack_supported(model)
    layers = linear_children(model)
    for parent, name, layer in layers:
        plain = unpacked(layer)
        setattr(parent, name, PrepackedLinear(plain, rows) if rows >= MIN_PREPACKED_ROWS else plain)
    return len(layers) if rows >= MIN_PREPACKED_ROWS else 0


def unpack_linears(model: nn.Module) -> None:
    """Undo :func:`prepack_linears`."""
    prepack_linears(model, 0)


def prepacked_rows(model: nn.Module) -> int | None:
    """The row count ``model``'s linear layers are packed for (None when none is packed)."""
    return next((module.rows for module in model.modules() if isinstance(module, PrepackedLinear)), None)
