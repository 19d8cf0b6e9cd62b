"""A PyTorch reading of ``medusa_lite/cpu/kernels/row_gemm.c``: its packed layout and its blocking, on any CPU.

The kernel multiplies x [R, K] by a weight w [N, K] packed into column blocks of BLOCK_COLS
outputs, ``packed[b][k][j] = w[b * BLOCK_COLS + j][k]`` (zero past N); each block's outputs are
accumulated over k for up to MAX_ROWS rows at a time, and only the first N columns are stored.
This module does the same indexing with tensors, so the logic (layout, block and row grouping,
the partial last block) is checked where the AVX-512 kernel cannot run; the vector arithmetic is
what it leaves to the kernel's own tests. The constants of each variant (AVX-512, AVX2) are
read from the C source, so the reference follows it.
"""

from __future__ import annotations

import re

import torch

from medusa_lite.cpu.kernels import SOURCE

# The preprocessor branch of each variant of row_gemm.c, by the macro its compiler flags define.
VARIANT_MACROS = {"avx512": "__AVX512F__", "avx2": "__AVX2__"}


def branch_define(branch: str, variant: str, name: str) -> int:
    match = re.search(rf"^#define {name} +(\d+)", branch, re.MULTILINE)
    assert match, f"row_gemm.c's {variant} branch no longer defines {name}: update tests/row_gemm_reference.py"
    return int(match.group(1))


def kernel_constants(source: str | None = None) -> dict[str, tuple[int, int]]:
    """{variant: (BLOCK_COLS, MAX_ROWS)} as row_gemm.c defines them (BLOCK_COLS = LANES * VECTORS)."""
    text = SOURCE.read_text() if source is None else source
    block = re.search(r"^#define BLOCK_COLS +(.+?) *(/\*.*)?$", text, re.MULTILINE)
    assert block and block.group(1).replace(" ", "") == "(LANES*VECTORS)", (
        "BLOCK_COLS changed: update tests/row_gemm_reference.py"
    )
    branches = re.split(r"^#(?:el)?if ", text, flags=re.MULTILINE)[1:]
    constants = {}
    for variant, macro in VARIANT_MACROS.items():
        branch = next((b for b in branches if b.startswith(f"defined({macro})")), None)
        assert branch is not None, f"row_gemm.c has no {macro} branch: update tests/row_gemm_reference.py"

        lanes, vectors, max_rows = (branch_define(branch, variant, name) for name in ("LANES", "VECTORS", "MAX_ROWS"))
        constants[variant] = (lanes * vectors, max_rows)
    return constants


def pack_reference(weight: torch.Tensor, block_cols: int) -> torch.Tensor:
    """row_gemm_pack: a flat float32 tensor of ceil(N / block_cols) blocks of [K, block_cols]."""
    out_features, in_features = weight.shape
    blocks = -(-out_features // block_cols)
    padded = torch.zeros(blocks * block_cols, in_features, dtype=torch.float32)
    padded[:out_features] = weight
    return padded.view(blocks, block_cols, in_features).transpose(1, 2).contiguous().view(-1)


def row_gemm_reference(
    inputs: torch.Tensor, packed: torch.Tensor, out_features: int, block_cols: int, max_rows: int
) -> torch.Tensor:
    """row_gemm: inputs [R, K] times the packed weight -> [R, out_features], by block, max_rows rows at a time."""
    rows, in_features = inputs.shape
    blocks = -(-out_features // block_cols)
    assert packed.numel() == blocks * in_features * block_cols, "packed buffer of the wrong size"
    by_block = packed.view(blocks, in_features, block_cols)
    output = torch.empty(rows, out_features, dtype=torch.float32)
    for b in range(blocks):
        first = b * block_cols
        stored = min(block_cols, out_features - first)  # the last block stores only the columns that exist
        for r0 in range(0, rows, max_rows):
            group = inputs[r0 : r0 + max_rows]
            accumulator = torch.zeros(group.shape[0], block_cols, dtype=torch.float32)
            for k in range(in_features):  # one pass over the block's rows of weights, in stored order
                accumulator += group[:, k : k + 1] * by_block[b, k]
            output[r0 : r0 + max_rows, first : first + stored] = accumulator[:, :stored]
    return output
