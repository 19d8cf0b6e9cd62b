"""Cheaper tree verification on CPU: few-row products by the linear weights, off PyTorch's usual path.

Verifying a tree multiplies every weight matrix of the target by a handful of rows (one per
node). Decoding is memory-bound, so that should cost what one row costs; PyTorch's float32 linear
does not get there (measured below). Two paths, chosen by :func:`prepack_linears`:

- ``"row_gemm"`` (used when available): :mod:`medusa_lite.cpu.kernels`' kernel (its AVX-512 or AVX2
  variant, as :func:`medusa_lite.cpu.kernels.kernel_path` decides), on one packed copy of each weight
  (column blocks).
- ``"onednn"`` (the fallback on x86-64: the kernel turned off, no C compiler, a CPU without AVX2):
  the oneDNN library PyTorch ships (``torch.ops.mkldnn._linear_pointwise``), which reads the weight
  as it is: no copy, any row count. Elsewhere (ARM, unmeasured) nothing is packed.

Both serve inputs of ``MIN_PACKED_ROWS`` to ``rows`` rows. :func:`prepack_linears` swaps every
``nn.Linear`` of a target for a :class:`PrepackedLinear` sharing its parameters; every other input
(one-token decoding, prefills longer than ``rows``) takes the usual path, bit for bit. The model's
parameters and ``state_dict`` are unchanged (the packed copy is not a buffer, and is ignored once
the weight changes: see :class:`PrepackedLinear`). :func:`medusa_lite.load` packs the target for its
tree plus the default prompt-lookup chain unless ``prepack=False``.

What each path costs per row count, measured on two CPUs: ``docs/results.md``, "Measurements
behind the code's choices" (and its oneDNN section). Only float32 on CPU is supported.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.cpu.kernels import pack_for_row_gemm, row_gemm, row_gemm_available, row_gemm_unavailable_reason
from medusa_lite.dtypes import dtype_name
from medusa_lite.errors import UnsupportedModelError

ROW_GEMM, ONEDNN = "row_gemm", "onednn"
BACKENDS = (ROW_GEMM, ONEDNN)
# oneDNN's few-row products were measured on x86-64 CPUs only; elsewhere (ARM) PyTorch's usual path stays.
ONEDNN_MACHINES = ("x86_64", "amd64")
# One row takes PyTorch's usual path, as model.generate's steps do (packed_from_rows(model, 1) sends
# it through the packed path instead); from two rows on both paths beat PyTorch's (measured above).
MIN_PACKED_ROWS = 2


@functools.cache
def onednn_available() -> bool:
    """Whether this machine (x86-64) and PyTorch build multiply float32 rows by a dense weight through oneDNN
    (tried once, on 3 x 2)."""
    if platform.machine().lower() not in ONEDNN_MACHINES:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    inputs, weight = torch.arange(6.0).reshape(3, 2), torch.eye(2)
    try:
        return torch.equal(onednn_linear(inputs, weight, None), inputs)
    except RuntimeError:
        return False


def onednn_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(inputs, weight, bias)`` for 2-D ``inputs``, through oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(inputs, weight, bias, "none", [], "")


def default_backend() -> str | None:
    """The packed path this machine runs: ``"row_gemm"`` when it builds, else ``"onednn"``, else None."""
    if row_gemm_available():
        return ROW_GEMM
    return ONEDNN if onednn_available() else None


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
            f"the row_gemm kernel is unavailable ({row_gemm_unavailable_reason()}) and oneDNN's linear is not "
            "available here (used on x86-64 PyTorch builds only)"
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
            "an AVX2 or AVX-512 CPU with a C compiler or a PyTorch built with oneDNN)"
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
    output = row_gemm(inputs if inputs.dim() == 2 else inputs.reshape(-1, inputs.shape[-1]), packed, out_features)
    if bias is not None:
        output += bias
    return output if inputs.dim() == 2 else output.view(*inputs.shape[:-1], out_features)


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


def packed_copy(weight: torch.Tensor, backend: str, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """row_gemm: one packed copy for any row count, in ``dtype`` (float32 or bfloat16); oneDNN: none (it reads
    the weight as it is)."""
    return pack_for_row_gemm(weight, dtype=dtype) if backend == ROW_GEMM else None


class PrepackedLinear(nn.Linear):
    """An ``nn.Linear`` (the same parameters) that multiplies few-row inputs by a packed copy.

    ``backend``: ``"row_gemm"`` or ``"onednn"`` (see the module docstring). The packed copy is a
    plain attribute, not a buffer: ``.to()``/``.half()`` never convert it, and it is used only
    while the weight is the very tensor, version, dtype and device it was packed from. After any
    change to the weight (loading, in-place updates, a dtype or device move) every input takes the
    usual path: still correct, no longer faster (pack again).

    ``packed_dtype`` bfloat16 (row_gemm only): the packed copy holds the weights rounded to bfloat16,
    half the bytes to read; its products then differ from float32's by that rounding, so only for a
    model whose outputs need not match float32's bit for bit (a drafter's guesses).
    """

    def __init__(
        self,
        linear: nn.Linear,
        rows: int,
        backend: str = ONEDNN,
        min_rows: int = MIN_PACKED_ROWS,
        packed_dtype: torch.dtype = torch.float32,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"unknown prepack backend {backend!r}: one of {BACKENDS}")
        if packed_dtype != torch.float32 and backend != ROW_GEMM:
            raise ValueError(f"only the row_gemm backend packs to {packed_dtype}; {backend!r} reads float32 weights")
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.rows, self.backend = rows, backend
        self.min_rows = min_rows  # fewer rows take the usual path (see ``packed_from_rows``)
        self.packed_weight = packed_copy(linear.weight, backend, packed_dtype)
        self.packed_from = weight_signature(linear.weight)

    def packed_path_applies(self, inputs: torch.Tensor) -> bool:
        return packed_copy_applies(self.weight, self.packed_from, inputs, self.min_rows, self.rows)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.packed_path_applies(inputs):
            return F.linear(inputs, self.weight, self.bias)
        if self.backend == ROW_GEMM:
            return row_gemm_linear(inputs, self.packed_weight, self.out_features, self.bias)
        output = onednn_linear(inputs.reshape(rows_of(inputs), self.in_features), self.weight, self.bias)
        return output.reshape(*inputs.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        packed = "" if self.packed_weight is None else f", packed_dtype={dtype_name(self.packed_weight.dtype)}"
        return f"{super().extra_repr()}, packed_rows={self.rows}, backend={self.backend}{packed}"


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


def prepack_linears(
    model: nn.Module,
    rows: int,
    backend: str | None = None,
    min_rows: int = MIN_PACKED_ROWS,
    packed_dtype: torch.dtype = torch.float32,
) -> int:
    """Pack every linear layer of ``model`` for inputs of ``min_rows`` to ``rows`` rows, in place; returns how many.

    ``min_rows`` 1 sends one-row inputs through the packed path too, and ``packed_dtype`` bfloat16
    (row_gemm only) reads half the bytes: both for a drafter, whose guesses need not match plain
    decoding bit for bit (a target keeps the defaults, so that one-token steps stay PyTorch's own
    and every product float32's).

    ``backend``: ``"row_gemm"`` or ``"onednn"``; None: :func:`default_backend`. Packing again
    replaces earlier packed copies; ``rows`` below ``MIN_PACKED_ROWS`` unpacks. Raises
    :class:`~medusa_lite.errors.UnsupportedModelError` (a ``ValueError``) unless
    :func:`prepack_supported`, or when the chosen backend is unavailable.
    """
    backend = backend or default_backend() or ONEDNN
    if backend not in BACKENDS:
        raise ValueError(f"unknown prepack backend {backend!r}: one of {BACKENDS}")
    packs = rows >= MIN_PACKED_ROWS
    if packs:
        check_prepack_supported(model)
        if backend == ROW_GEMM and not row_gemm_available():
            raise UnsupportedModelError(f"cannot pre-pack for the row_gemm kernel: {row_gemm_unavailable_reason()}")
        if backend == ONEDNN and not onednn_available():
            raise UnsupportedModelError("cannot use oneDNN for few-row products: unavailable here (x86-64 only)")
    layers = linear_children(model)
    for parent, name, layer in layers:
        plain = unpacked(layer)
        setattr(parent, name, PrepackedLinear(plain, rows, backend, min_rows, packed_dtype) if packs else plain)
    return len(layers) if packs else 0


@contextmanager
def bounds_set(layers: list[PrepackedLinear], bound: str, new: Callable[[int], int]) -> Iterator[None]:
    """Within the block each layer's ``bound`` (``"min_rows"`` or ``"rows"``) is ``new(its value)``; the values
    come back on exit, an exception included."""
    before = [getattr(layer, bound) for layer in layers]
    for layer, value in zip(layers, before):
        setattr(layer, bound, new(value))
    try:
        yield
    finally:
        for layer, value in zip(layers, before):
            setattr(layer, bound, value)


@contextmanager
def packed_from_rows(model: nn.Module, min_rows: int) -> Iterator[None]:
    """Within the block, inputs of ``min_rows`` rows or more (up to the packed count) take the packed path.

    ``packed_from_rows(model, 1)`` sends one-token decoding through the packed path too: on CPUs
    where PyTorch's own float32 one-row linear is slow (docs/results.md, "Measurements behind the code's
    choices") plain decoding then runs faster, which is how
    ``infer/benchmark.py``'s ``plain_kernel`` tells the packed path's share of a speed-up from the
    speculation's. The previous minimum comes back on exit.
    """
    if min_rows < 1:
        raise ValueError(f"min_rows must be at least 1, got {min_rows}")
    layers = [module for module in model.modules() if isinstance(module, PrepackedLinear)]
    if not layers:
        raise UnsupportedModelError(
            "the model's linear layers are not pre-packed (medusa_lite.load(prepack=True) packs float32 models on CPU)"
        )
    with bounds_set(layers, "min_rows", lambda _: min_rows):
        yield


@contextmanager
def packed_up_to_rows(model: nn.Module, max_rows: int) -> Iterator[None]:
    """Within the block, inputs of up to ``max_rows`` rows (from each layer's ``min_rows``) take the packed path.

    A batch of B sequences verifies B drafts in one forward, more rows than one sequence's tree that
    :func:`prepack_linears` packed for; the packed copy serves any row count, so only the bound moves
    (:mod:`medusa_lite.decoding.batch`). Layers packed for more rows keep their bound; an unpacked model is
    unchanged."""
    layers = [module for module in model.modules() if isinstance(module, PrepackedLinear)]
    with bounds_set(layers, "rows", lambda rows: max(rows, max_rows)):
        yield


def unpack_linears(model: nn.Module) -> None:
    """Undo :func:`prepack_linears`."""
    prepack_linears(model, 0)


def prepacked_rows(model: nn.Module) -> int | None:
    """The row count ``model``'s linear layers are packed for (None when none is packed)."""
    return next((module.rows for module in model.modules() if isinstance(module, PrepackedLinear)), None)


def prepack_layout(model: nn.Module) -> dict | None:
    """The packed path and the most rows it serves, for cost-cache keys (None when nothing is packed):
    ``{"backend": "onednn", "rows": 14}``."""
    layer = next((module for module in model.modules() if isinstance(module, PrepackedLinear)), None)
    return None if layer is None else {"backend": layer.backend, "rows": layer.rows}


def prepack_backend(model: nn.Module) -> str | None:
    """The packed path ``model``'s linear layers use (None when none is packed)."""
    return next((module.backend for module in model.modules() if isinstance(module, PrepackedLinear)), None)
