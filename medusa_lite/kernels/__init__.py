"""Hand-written CPU kernels, built on first use with the system C compiler and loaded with ctypes.

Only what no library does well enough is here: :mod:`row_gemm.c`, a float32 product of a
few rows (a tree's nodes) by a weight matrix that costs about what one row costs (MKL's GEMM,
packed or not, costs 1.5-2x for 4-8 rows on a 2-core AVX-512 CPU; see ``medusa_lite.prepack``).

The library is compiled once per source version into ``<medusa-lite cache>/kernels/`` (``cc``,
or ``$CC``, with OpenMP; every call passes ``torch.get_num_threads()``, so ``torch.set_num_threads``
applies even where this library's OpenMP runtime is not PyTorch's). Without an AVX-512 CPU, a C compiler or PyTorch's OpenMP, :func:`row_gemm_unavailable_reason`
says why and callers keep PyTorch's own kernels.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from medusa_lite.default_model import cache_root

SOURCE = Path(__file__).resolve().parent / "row_gemm.c"
COMPILE_FLAGS = ("-O3", "-mavx512f", "-mfma", "-fopenmp", "-shared", "-fPIC")
COMPILE_TIMEOUT_S = 120
AVX512_CAPABILITIES = ("AVX512", "AMX")  # torch.backends.cpu.get_cpu_capability() values with AVX-512F


class KernelBuildError(RuntimeError):
    """The row-GEMM kernel could not be compiled or loaded (the message says why)."""


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cpu_has_avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability() in AVX512_CAPABILITIES


def library_path() -> Path:
    """Where the built library lives: named by a hash of the source and flags, so edits rebuild."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(COMPILE_FLAGS).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"row_gemm-{digest}.so"


def build_library(path: Path) -> None:
    """Compile :data:`SOURCE` to ``path`` (written to a temporary name first, then renamed)."""
    cc = compiler()
    if cc is None:
        raise KernelBuildError("no C compiler found (set $CC, or install gcc)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        built = Path(scratch) / path.name
        try:
            result = subprocess.run([cc, *COMPILE_FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as error:
            raise KernelBuildError(f"cannot run the C compiler {cc!r}: {error}") from error
        if result.returncode != 0:
            raise KernelBuildError(f"{cc} failed to compile {SOURCE.name}: {result.stderr.strip()[-2000:]}")
        os.replace(built, path)


@functools.cache
def row_gemm_library() -> ctypes.CDLL:
    """The loaded kernel library (built on first call); raises :class:`KernelBuildError`."""
    if not cpu_has_avx512():
        raise KernelBuildError(f"the CPU lacks AVX-512 (PyTorch reports {torch.backends.cpu.get_cpu_capability()})")
    path = library_path()
    if not path.is_file():
        build_library(path)
    try:
        library = ctypes.CDLL(str(path))
    except OSError as error:
        raise KernelBuildError(f"cannot load {path}: {error}") from error
    pointers, sizes, threads = [ctypes.c_void_p] * 3, [ctypes.c_long] * 3, [ctypes.c_int]
    library.row_gemm.argtypes, library.row_gemm.restype = pointers + sizes + threads, None
    library.row_gemm_pack.argtypes, library.row_gemm_pack.restype = pointers[:2] + sizes[:2] + threads, None
    library.row_gemm_block_cols.restype = library.row_gemm_max_rows.restype = ctypes.c_long
    return library


@functools.cache
def row_gemm_unavailable_reason() -> str | None:
    """Why :func:`row_gemm` cannot run here (None when it can)."""
    try:
        row_gemm_library()
    except (KernelBuildError, OSError, subprocess.SubprocessError) as error:
        return str(error)
    return None


def row_gemm_available() -> bool:
    return row_gemm_unavailable_reason() is None


@functools.cache
def block_columns() -> int:
    """Outputs per column block of a packed weight (asked of the library once, not on every product)."""
    return row_gemm_library().row_gemm_block_cols()


def packed_size(out_features: int, in_features: int) -> int:
    """Floats in a packed copy: whole column blocks (the last one zero-padded)."""
    cols = block_columns()
    return -(-out_features // cols) * cols * in_features


def pack_for_row_gemm(weight: torch.Tensor) -> torch.Tensor:
    """A float32 CPU weight [N, K] re-laid out in column blocks for :func:`row_gemm` (a new tensor)."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"row_gemm packs 2-D float32 CPU weights, got {tuple(weight.shape)} {weight.dtype} on {weight.device}")
    weight = weight.detach().contiguous()
    out_features, in_features = weight.shape
    packed = torch.empty(packed_size(out_features, in_features), dtype=torch.float32)
    row_gemm_library().row_gemm_pack(weight.data_ptr(), packed.data_ptr(), out_features, in_features, torch.get_num_threads())
    return packed


def row_gemm(inputs: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``inputs`` [R, K] (float32, CPU) @ the packed weight's transpose -> [R, out_features]."""
    inputs = inputs.contiguous()
    rows, in_features = inputs.shape
    if inputs.dtype != torch.float32 or inputs.device.type != "cpu" or packed.numel() != packed_size(out_features, in_features):
        raise ValueError(
            f"row_gemm: inputs {tuple(inputs.shape)} {inputs.dtype} on {inputs.device} do not fit a packed "
            f"weight of {packed.numel()} floats for {out_features} outputs"
        )
    output = torch.empty(rows, out_features, dtype=torch.float32)
    row_gemm_library().row_gemm(inputs.data_ptr(), packed.data_ptr(), output.data_ptr(), rows, out_features, in_features, torch.get_num_threads())
    return output
