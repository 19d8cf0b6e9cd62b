"""Hand-written CPU kernels, built on first use with the system C compiler and loaded with ctypes.

Only what no library does well enough is here: :mod:`row_gemm.c`, a float32 product of a
few rows (a tree's nodes) by a weight matrix that costs about what one row costs (PyTorch's GEMM,
packed or not, costs 1.5-2x for 4-8 rows on a 2-core CPU; see ``medusa_lite.cpu.prepack``).

Which kernel runs is decided once per process by :func:`kernel_path`, the one source of truth
the CLI summary and the benchmark results report. The environment variable ``MEDUSA_LITE_KERNEL``
chooses:

- ``auto`` (the default): the widest variant of ``row_gemm.c`` this CPU runs: ``avx512``
  (AVX-512F + FMA), else ``avx2`` (AVX2 + FMA), else none (PyTorch's own kernels: ARM, older x86);
- ``avx512`` or ``avx2``: that variant (none, with the reason, when this CPU lacks it);
- ``off``: none (what a CPU without the instructions gets): few-row products then go through
  oneDNN where PyTorch has it (``medusa_lite.cpu.prepack``), else PyTorch's usual path.

The CPU's features are PyTorch's (``torch.backends.cpu.get_cpu_capability()``). Each variant is
compiled once per source version into ``<medusa-lite cache>/kernels/`` (``cc``, or ``$CC``, with
OpenMP; every call passes ``torch.get_num_threads()``, so ``torch.set_num_threads`` applies even
where this library's OpenMP runtime is not PyTorch's). Without a C compiler or OpenMP,
:func:`row_gemm_unavailable_reason` says why and callers keep PyTorch's own kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from medusa_lite.errors import MedusaError
from medusa_lite.paths import cache_root, existing_entry, writable_entry

SOURCE = Path(__file__).resolve().parent / "row_gemm.c"
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC")
COMPILE_TIMEOUT_S = 120
KERNEL_ENV_VAR = "MEDUSA_LITE_KERNEL"
AUTO, OFF, AVX512, AVX2 = "auto", "off", "avx512", "avx2"
# The variants of row_gemm.c, widest first: instruction-set flags, and the PyTorch CPU
# capabilities (torch.backends.cpu.get_cpu_capability()) under which the CPU runs them.
VARIANT_FLAGS = {AVX512: ("-mavx512f", "-mfma"), AVX2: ("-mavx2", "-mfma")}
VARIANT_CAPABILITIES = {AVX512: ("AVX512", "AMX"), AVX2: ("AVX2", "AVX512", "AMX")}
KERNEL_CHOICES = (AUTO, OFF, *VARIANT_FLAGS)
# What a packed copy may hold: float32, or bfloat16 (half the bytes; see row_gemm.c).
PACKED_DTYPES = (torch.float32, torch.bfloat16)


class KernelBuildError(RuntimeError):
    """The row-GEMM kernel could not be compiled or loaded (the message says why)."""


class KernelChoiceError(MedusaError, ValueError):
    """``MEDUSA_LITE_KERNEL`` holds a value that names no kernel choice."""


@dataclass(frozen=True)
class KernelPath:
    """Which few-row kernel this process uses: ``variant`` ("avx512", "avx2") or None (PyTorch's own), and why."""

    requested: str  # the MEDUSA_LITE_KERNEL value ("auto" when unset)
    variant: str | None
    reason: str  # why no variant runs ("" when one does)

    def describe(self) -> str:
        """One line for summaries: ``row_gemm avx2 (MEDUSA_LITE_KERNEL=auto)`` or ``off (...)``."""
        where = f"{KERNEL_ENV_VAR}={self.requested}"
        return f"row_gemm {self.variant} ({where})" if self.variant else f"off ({where}: {self.reason})"

    def as_dict(self) -> dict:
        return {"requested": self.requested, "variant": self.variant, "reason": self.reason or None}


def requested_kernel() -> str:
    """``MEDUSA_LITE_KERNEL`` (``auto`` when unset); a clear error for a value that names no choice."""
    value = os.environ.get(KERNEL_ENV_VAR, AUTO).strip().lower() or AUTO
    if value not in KERNEL_CHOICES:
        raise KernelChoiceError(f"{KERNEL_ENV_VAR}={value!r} is not one of {', '.join(KERNEL_CHOICES)}")
    return value


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


def cpu_runs(variant: str) -> bool:
    return cpu_capability() in VARIANT_CAPABILITIES[variant]


def cpu_has_avx512() -> bool:
    return cpu_runs(AVX512)


def compile_flags(variant: str) -> tuple[str, ...]:
    return (*BASE_FLAGS, *VARIANT_FLAGS[variant])


def library_path(variant: str = AVX512) -> Path:
    """Where a variant's built library lives: named by a hash of the source and flags, so edits rebuild."""
    flags = compile_flags(variant)
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"row_gemm-{variant}-{digest}.so"


def build_library(path: Path, variant: str = AVX512) -> None:
    """Compile :data:`SOURCE` for ``variant`` to ``path`` (written to a temporary name first, then renamed)."""
    cc = compiler()
    if cc is None:
        raise KernelBuildError("no C compiler found (set $CC, or install gcc)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        built = Path(scratch) / path.name
        command = [cc, *compile_flags(variant), str(SOURCE), "-o", str(built)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as error:
            raise KernelBuildError(f"cannot run the C compiler {cc!r}: {error}") from error
        if result.returncode != 0:
            raise KernelBuildError(
                f"{cc} failed to compile {SOURCE.name} ({variant}): {result.stderr.strip()[-2000:]}"
            )
        os.replace(built, path)


def variant_library(variant: str) -> ctypes.CDLL:
    """The loaded library of one variant (built on first call); raises :class:`KernelBuildError`."""
    if variant not in VARIANT_FLAGS:
        raise KernelBuildError(f"unknown row_gemm variant {variant!r}: one of {', '.join(VARIANT_FLAGS)}")
    if not cpu_runs(variant):
        raise KernelBuildError(f"the CPU lacks {variant.upper()} (PyTorch reports {cpu_capability()})")
    return loaded_library(variant)


@functools.cache
def loaded_library(variant: str) -> ctypes.CDLL:
    path = existing_entry(library_path(variant))
    if not path.is_file():
        path = writable_entry(path)
        build_library(path, variant)
    try:
        library = ctypes.CDLL(str(path))
    except OSError as error:
        raise KernelBuildError(f"cannot load {path}: {error}") from error
    pointers, sizes, threads = [ctypes.c_void_p] * 3, [ctypes.c_long] * 3, [ctypes.c_int]
    library.row_gemm.argtypes, library.row_gemm.restype = pointers + sizes + threads, None
    library.row_gemm_bf16.argtypes, library.row_gemm_bf16.restype = pointers + sizes + threads, None
    library.row_gemm_pack.argtypes, library.row_gemm_pack.restype = pointers[:2] + sizes[:2] + threads, None
    library.row_gemm_block_cols.restype = library.row_gemm_max_rows.restype = ctypes.c_long
    return library


def variant_unavailable_reason(variant: str) -> str | None:
    """Why ``variant`` cannot run here (None when it can)."""
    try:
        variant_library(variant)
    except (KernelBuildError, OSError, subprocess.SubprocessError) as error:
        return str(error)
    return None


@functools.cache
def kernel_path() -> KernelPath:
    """The kernel this process uses (decided on first call, from ``MEDUSA_LITE_KERNEL`` and the CPU)."""
    requested = requested_kernel()
    if requested == OFF:
        return KernelPath(requested, None, f"turned off by {KERNEL_ENV_VAR}")
    candidates = list(VARIANT_FLAGS) if requested == AUTO else [requested]
    reasons = []
    for variant in candidates:
        reason = variant_unavailable_reason(variant)
        if reason is None:
            return KernelPath(requested, variant, "")
        reasons.append(reason)
    return KernelPath(requested, None, "; ".join(reasons))


def choose_kernel(choice: str) -> KernelPath:
    """Set ``MEDUSA_LITE_KERNEL`` to ``choice`` for this process and decide again (before any weight is packed)."""
    os.environ[KERNEL_ENV_VAR] = choice
    kernel_path.cache_clear()
    return kernel_path()


def selected_variant(variant: str | None) -> str:
    """``variant``, or this process's (:func:`kernel_path`); raises :class:`KernelBuildError` when none runs."""
    if variant is not None:
        return variant
    path = kernel_path()
    if path.variant is None:
        raise KernelBuildError(path.reason)
    return path.variant


def row_gemm_library(variant: str | None = None) -> ctypes.CDLL:
    """The loaded library of ``variant`` (None: this process's); raises :class:`KernelBuildError`."""
    return variant_library(selected_variant(variant))


def row_gemm_unavailable_reason() -> str | None:
    """Why this process uses no row_gemm variant (None when it uses one)."""
    path = kernel_path()
    return None if path.variant else path.reason


def row_gemm_available() -> bool:
    return row_gemm_unavailable_reason() is None


def block_columns(variant: str | None = None) -> int:
    """Outputs per column block of a packed weight for ``variant`` (None: this process's)."""
    return variant_block_columns(selected_variant(variant))


@functools.cache
def bound_library(variant: str) -> tuple[ctypes.CDLL, int]:
    """A variant's library and its block width, looked up once: :func:`row_gemm` runs for every linear layer of
    a forward, where each microsecond of Python counts (~200 layers a step for SmolLM2)."""
    return variant_library(variant), variant_block_columns(variant)


@functools.cache
def variant_block_columns(variant: str) -> int:
    """Asked of the library once, not on every product."""
    return variant_library(variant).row_gemm_block_cols()


def packed_size(out_features: int, in_features: int, variant: str | None = None) -> int:
    """Values in a packed copy: whole column blocks (the last one zero-padded)."""
    cols = block_columns(variant)
    return -(-out_features // cols) * cols * in_features


def pack_for_row_gemm(
    weight: torch.Tensor, variant: str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A float32 CPU weight [N, K] re-laid out in column blocks for :func:`row_gemm` (a new tensor).

    ``dtype`` :data:`PACKED_DTYPES`: float32 (products as ``F.linear``'s, up to summation order) or
    bfloat16 (each weight rounded to nearest even: half the bytes to read, for callers whose
    outputs need not match float32's, such as a drafter's guesses).
    """
    if dtype not in PACKED_DTYPES:
        raise ValueError(f"row_gemm packs to one of {PACKED_DTYPES}, not {dtype}")
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(
            f"row_gemm packs 2-D float32 CPU weights, got {tuple(weight.shape)} {weight.dtype} on {weight.device}"
        )
    weight = weight.detach().contiguous()
    out_features, in_features = weight.shape
    packed = torch.empty(packed_size(out_features, in_features, variant), dtype=torch.float32)
    row_gemm_library(variant).row_gemm_pack(
        weight.data_ptr(), packed.data_ptr(), out_features, in_features, torch.get_num_threads()
    )
    return packed.to(dtype)


def row_gemm(
    inputs: torch.Tensor, packed: torch.Tensor, out_features: int, variant: str | None = None
) -> torch.Tensor:
    """``inputs`` [R, K] (float32, CPU) @ the packed weight's transpose -> [R, out_features].

    ``variant``: the one ``packed`` was packed for (None: this process's, as :func:`pack_for_row_gemm` uses).
    ``packed``'s dtype (float32 or bfloat16) chooses the kernel.
    """
    inputs = inputs.contiguous()
    rows, in_features = inputs.shape
    library, cols = bound_library(selected_variant(variant))
    if (
        inputs.dtype != torch.float32
        or inputs.device.type != "cpu"
        or packed.dtype not in PACKED_DTYPES
        or packed.numel() != -(-out_features // cols) * cols * in_features
    ):
        raise ValueError(
            f"row_gemm: inputs {tuple(inputs.shape)} {inputs.dtype} on {inputs.device} do not fit a packed "
            f"weight of {packed.numel()} {packed.dtype} values for {out_features} outputs"
        )
    output = torch.empty(rows, out_features, dtype=torch.float32)
    product = library.row_gemm if packed.dtype == torch.float32 else library.row_gemm_bf16
    product(
        inputs.data_ptr(),
        packed.data_ptr(),
        output.data_ptr(),
        rows,
        out_features,
        in_features,
        torch.get_num_threads(),
    )
    return output
