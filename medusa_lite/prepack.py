"""Cheaper tree verification on CPU: linear weights pre-packed for a few-row GEMM.

Verifying a tree multiplies every weight matrix of the target by a handful of rows (one per
node). Decoding is memory-bound, so that should cost what one row costs; PyTorch's float32 linear
does not get there (measured below). Two packed paths, chosen by :func:`prepack_linears`:

- ``"row_gemm"`` (used when available): :mod:`medusa_lite.kernels`' kernel (its AVX-512 or AVX2
  variant, as :func:`medusa_lite.kernels.kernel_path` decides), for ``ROW_GEMM_MIN_ROWS`` to
  ``rows`` rows, on one packed copy of each weight (column blocks).
- ``"mkl"`` (the fallback): MKL's packed GEMM (``torch.ops.mkl._mkl_reorder_linear_weight``, the
  op TorchInductor's freezing pass uses). MKL packs a weight for one exact row count, so each
  weight gets a copy per row bucket (:func:`mkl_row_buckets`: 4, 8, 16, ... below ``rows``, and
  ``rows``) and an input of ``MIN_PREPACKED_ROWS`` to ``rows`` rows is zero-padded to the
  smallest bucket that holds it: a 5-row tree pays for 8 rows, not for the 14 of the widest step.

:func:`prepack_linears` swaps every ``nn.Linear`` of a target for a :class:`PrepackedLinear`
sharing its parameters; every other input (one-token decoding, prefills longer than ``rows``)
takes the usual path, bit for bit. The model's parameters and ``state_dict`` are unchanged (the
packed copy is not a buffer, and is ignored once the weight changes: see :class:`PrepackedLinear`).
:func:`medusa_lite.load` packs the target for its tree plus the default prompt-lookup chain
unless ``prepack=False``.

Measured (SmolLM2-135M, float32, 2-core AVX-512 Xeon, 2 threads; all 211 linear layers of one
forward, kernels only): 1 row 27-29 ms (PyTorch); 6 rows 51-57 ms PyTorch, 40-48 ms MKL packed,
29 ms row_gemm; 8 rows 61-64 / 45 / 30 ms; 16 rows 46 ms row_gemm. The measurements behind the
MKL buckets, and the AVX2 variant beside them: ``docs/results.md`` (few-row products). The packed
copies cost memory (one copy of the weights for row_gemm, one per bucket for MKL) and only
float32 on CPU is supported.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.dtypes import dtype_name
from medusa_lite.errors import UnsupportedModelError
from medusa_lite.kernels import pack_for_row_gemm, row_gemm, row_gemm_available, row_gemm_unavailable_reason

ROW_GEMM, MKL = "row_gemm", "mkl"
BACKENDS = (ROW_GEMM, MKL)
# Below this many rows the backend is no faster than PyTorch's own float32 path (measured above;
# MKL packed: 2 and 3 nodes cost 1.14x and 1.18-1.28x a one-token step either way).
ROW_GEMM_MIN_ROWS = 2
MIN_PREPACKED_ROWS = 4
BACKEND_MIN_ROWS = {ROW_GEMM: ROW_GEMM_MIN_ROWS, MKL: MIN_PREPACKED_ROWS}


def mkl_row_buckets(rows: int) -> tuple[int, ...]:
    """The row counts MKL packs a weight for, up to ``rows``: powers of two from ``MIN_PREPACKED_ROWS``, then ``rows``.

    Padding a product to the next power of two costs at most what twice its rows cost and each
    bucket is one more copy of the weight, so the copies stay few (3 for the default 14 rows).
    """
    if rows < MIN_PREPACKED_ROWS:
        return ()
    doublings = [
        MIN_PREPACKED_ROWS << shift for shift in range(rows.bit_length()) if MIN_PREPACKED_ROWS << shift < rows
    ]
    return (*doublings, rows)


def smallest_bucket(buckets: Iterable[int], rows: int) -> int:
    """The first of the ascending ``buckets`` that holds ``rows`` rows."""
    return next(bucket for bucket in buckets if bucket >= rows)


def mkl_packing_available() -> bool:
    """Whether this PyTorch build has MKL's packed linear ops."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def default_backend() -> str | None:
    """The packed path this machine runs: ``"row_gemm"`` when it builds, else ``"mkl"``, else None."""
    if row_gemm_available():
        return ROW_GEMM
    return MKL if mkl_packing_available() else None


def prepack_unsupported_reason(model: nn.Module) -> str | None:
    """Why :func:`prepack_linears` does not apply to ``model`` (None when it does: float32 on CPU, a backend)."""
    parameter = next(model.parameters(), None)
    if parameter is None:
        return "the model has no parameters"
    if parameter.device.type != "cpu":
        return f"the model is on {parameter.device}, not on the CPU"
    if parameter.dtype != torch.float32:
        return f"the model's weights are {dtype_name(parameter.dtype)}, not float32"
    if default_backend() is None:
        return (
            f"the row_gemm kernel is unavailable ({row_gemm_unavailable_reason()}) and this PyTorch build has no "
            "MKL packed linear ops"
        )
    return None


def prepack_supported(model: nn.Module) -> bool:
    """Whether :func:`prepack_linears` applies to ``model``: float32 weights on CPU and a packed path."""
    return prepack_unsupported_reason(model) is None


def check_prepack_supported(model: nn.Module) -> None:
    """Raise :class:`UnsupportedModelError`, saying why, unless :func:`prepack_supported`."""
    reason = prepack_unsupported_reason(model)
    if reason is not None:
        raise UnsupportedModelError(
            f"cannot pre-pack linear weights: {reason} (pre-packing needs float32 weights on CPU and either "
            "an AVX2 or "
            "AVX-512 CPU with a C compiler or a PyTorch built with MKL)"
        )


def rows_of(inputs: torch.Tensor) -> int:
    """How many rows a linear layer multiplies for ``inputs`` [..., in_features]."""
    return inputs.numel() // inputs.shape[-1] if inputs.shape[-1] else 0


def row_gemm_linear(
    inputs: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """``F.linear(inputs, weight, bias)`` [..., out_features] through the row_gemm kernel, ``packed`` being the
    weight's packed copy.
    """
    output = row_gemm(inputs.reshape(rows_of(inputs), inputs.shape[-1]), packed, out_features)
    if bias is not None:
        output += bias
    return output.reshape(*inputs.shape[:-1], out_features)


def weight_signature(weight: torch.Tensor) -> tuple:
    """What identifies the values a packed copy was made from: storage, in-place version, dtype, device."""
    return (weight.data_ptr(), weight._version, weight.dtype, weight.device)


def packed_copy_applies(
    weight: torch.Tensor, packed_from: tuple, inputs: torch.Tensor, min_rows: int, max_rows: int
) -> bool:
    """Whether ``inputs`` @ ``weight``.T may use a packed copy of ``weight`` made when its signature was
    ``packed_from``.

    Only for inputs of ``min_rows`` to ``max_rows`` rows in the weight's dtype, without gradients
    (training takes the usual path) and while the weight is unchanged (:func:`weight_signature`).
    """
    return (
        min_rows <= rows_of(inputs) <= max_rows
        and inputs.dtype == weight.dtype
        and not torch.is_grad_enabled()
        and weight_signature(weight) == packed_from
    )


def packed_copy(weight: torch.Tensor, rows: int, backend: str) -> torch.Tensor | dict[int, torch.Tensor]:
    """row_gemm: one packed copy for any row count; MKL: a copy per row bucket, keyed by its row count."""
    if backend == ROW_GEMM:
        return pack_for_row_gemm(weight)
    return {
        bucket: torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), bucket) for bucket in mkl_row_buckets(rows)
    }


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` (the same parameters) that multiplies few-row inputs by a packed copy.

    ``backend``: ``"row_gemm"`` or ``"mkl"`` (see the module docstring). The packed copy is a
    plain attribute, not a buffer: ``.to()``/``.half()`` never convert it, and it is used only
    while the weight is the very tensor, version, dtype and device it was packed from. After any
    change to the weight (loading, in-place updates, a dtype or device move) every input takes the
    usual path: still correct, no longer faster (pack again).
    """

    def __init__(self, linear: nn.Linear, rows: int, backend: str = MKL):
        if backend not in BACKENDS:
            raise ValueError(f"unknown prepack backend {backend!r}: one of {BACKENDS}")
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.rows, self.backend = rows, backend
        self.min_rows = BACKEND_MIN_ROWS[backend]  # fewer rows take the usual path (see ``packed_from_rows``)
        self.packed_weight = packed_copy(linear.weight, rows, backend)
        self.packed_from = weight_signature(linear.weight)

    def packed_path_applies(self, inputs: torch.Tensor) -> bool:
        return packed_copy_applies(self.weight, self.packed_from, inputs, self.min_rows, self.rows)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.packed_path_applies(inputs):
            return F.linear(inputs, self.weight, self.bias)
        if self.backend == ROW_GEMM:
            return row_gemm_linear(inputs, self.packed_weight, self.out_features, self.bias)
        rows = rows_of(inputs)
        bucket = smallest_bucket(self.packed_weight, rows)  # its keys, ascending
        flat = inputs.reshape(rows, self.in_features)
        padded = F.pad(flat, (0, 0, 0, bucket - rows))
        output = torch.ops.mkl._mkl_linear(padded, self.packed_weight[bucket], self.weight, self.bias, bucket)[:rows]
        return output.reshape(*inputs.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, packed_rows={self.rows}, backend={self.backend}"


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


def prepack_linears(model: nn.Module, rows: int, backend: str | None = None) -> int:
    """Pack every linear layer of ``model`` for inputs of up to ``rows`` rows, in place; returns how many.

    ``backend``: ``"row_gemm"`` or ``"mkl"``; None: :func:`default_backend`. Packing again
    replaces earlier packed copies; ``rows`` below the backend's minimum (``ROW_GEMM_MIN_ROWS``,
    ``MIN_PREPACKED_ROWS``) unpacks. Raises :class:`~medusa_lite.errors.UnsupportedModelError`
    (a ``ValueError``) unless :func:`prepack_supported`, or when the chosen backend is unavailable.
    """
    backend = backend or default_backend() or MKL
    if backend not in BACKENDS:
        raise ValueError(f"unknown prepack backend {backend!r}: one of {BACKENDS}")
    packs = rows >= BACKEND_MIN_ROWS[backend]
    if packs:
        check_prepack_supported(model)
        if backend == ROW_GEMM and not row_gemm_available():
            raise UnsupportedModelError(f"cannot pre-pack for the row_gemm kernel: {row_gemm_unavailable_reason()}")
        if backend == MKL and not mkl_packing_available():
            raise UnsupportedModelError("cannot pre-pack for MKL: this PyTorch build has no MKL packed linear ops")
    layers = linear_children(model)
    for parent, name, layer in layers:
        plain = unpacked(layer)
        setattr(parent, name, PrepackedLinear(plain, rows, backend) if packs else plain)
    return len(layers) if packs else 0


@contextmanager
def packed_from_rows(model: nn.Module, min_rows: int) -> Iterator[None]:
    """Within the block, inputs of ``min_rows`` rows or more (up to the packed count) take the packed path.

    ``packed_from_rows(model, 1)`` sends one-token decoding through the row_gemm kernel too: on
    CPUs where PyTorch's own float32 one-row linear is slow (measured on a 2-core AMD EPYC: the
    lm_head 11.3 ms against 2.9 ms) plain decoding then runs about twice as fast, which is how
    ``infer/benchmark.py``'s ``plain_kernel`` tells the kernel's share of a speed-up from the
    speculation's. Only the row_gemm backend packs for a single row; the previous minimum comes
    back on exit.
    """
    if min_rows < 1:
        raise ValueError(f"min_rows must be at least 1, got {min_rows}")
    layers = [module for module in model.modules() if isinstance(module, PrepackedLinear)]
    if not layers:
        raise UnsupportedModelError(
            "the model's linear layers are not pre-packed (medusa_lite.load(prepack=True) packs float32 models on CPU)"
        )
    if min_rows < BACKEND_MIN_ROWS[ROW_GEMM] and any(layer.backend != ROW_GEMM for layer in layers):
        raise UnsupportedModelError(
            f"only the row_gemm backend takes inputs of {min_rows} row(s); this model is packed for MKL"
        )
    before = [layer.min_rows for layer in layers]
    for layer in layers:
        layer.min_rows = min_rows
    try:
        yield
    finally:
        for layer, previous in zip(layers, before):
            layer.min_rows = previous


def unpack_linears(model: nn.Module) -> None:
    """Undo :func:`prepack_linears`."""
    prepack_linears(model, 0)


def prepacked_rows(model: nn.Module) -> int | None:
    """The row count ``model``'s linear layers are packed for (None when none is packed)."""
    return next((module.rows for module in model.modules() if isinstance(module, PrepackedLinear)), None)


def prepack_layout(model: nn.Module) -> dict | None:
    """The packed path and the row counts it serves, for cost-cache keys (None when nothing is packed):
    ``{"backend": "mkl", "buckets": [4, 8, 14]}``; row_gemm serves every count with one copy (no buckets)."""
    layer = next((module for module in model.modules() if isinstance(module, PrepackedLinear)), None)
    if layer is None:
        return None
    buckets = list(mkl_row_buckets(layer.rows)) if layer.backend == MKL else None
    return {"backend": layer.backend, "rows": layer.rows, "buckets": buckets}


def prepack_backend(model: nn.Module) -> str | None:
    """The packed path ``model``'s linear layers use (None when none is packed)."""
    return next((module.backend for module in model.modules() if isinstance(module, PrepackedLinear)), None)
