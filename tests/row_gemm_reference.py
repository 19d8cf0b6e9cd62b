"""A PyTorch reading of ``medusa_lite/kernels/row_gemm.c``: its packed layout and its blocking, on any CPU.

The kernel multiplies x [R, K] by a weight w [N, K] packed into column blocks of BLOCK_COLS
outputs, ``packed[b][k][j] = w[b * BLOCK_COLS + j][k]`` (zero past N); each block's outputs are
accumulated over k for up to MAX_ROWS rows at a time, and only the first N columns are stored.
This module does the same indexing with tensors, so the logic (layout, block and row grouping,
the partial last block) is checked where the AVX-512 kernel cannot run; the vector arithmetic is
what it leaves to the kernel's own tests. The constants are read from the C source, so the
reference follows it.
"""

from __future__ import annotations

import re

import torch

from medusa_lite.kernels import SOURCE

FLOATS_PER_VECTOR = 16  # one zmm register of float32


def kernel_constants(source: str | None = None) -> tuple[int, int]:
    """(BLOCK_COLS, MAX_ROWS) as row_gemm.c defines them."""
    text = SOURCE.read_text() if source is None else source

    def define(name: str) -> str:
        match = re.search(rf"^#define {name} +(.+?) *(/\*.*)?$", text, re.MULTILINE)
        assert match, f"row_gemm.c no longer defines {name}: update tests/row_gemm_reference.py"
        return match.group(1)

    vectors = int(define("VECTORS"))
    block = define("BLOCK_COLS")
    assert block.replace(" ", "") == f"({FLOATS_PER_VECTOR}*VECTORS)", f"BLOCK_COLS is now {block}: update the reference"
    return FLOATS_PER_VECTOR * vectors, int(define("MAX_ROWS"))


def pack_reference(weight: torch.Tensor, block_cols: int) -> torch.Tensor:
    """row_gemm_pack: a flat float32 tensor of ceil(N / block_cols) blocks of [K, block_cols]."""
    out_features, in_features = weight.shape
    blocks = -(-out_features // block_cols)
    padded = torch.zeros(blocks * block_cols, in_features, dtype=torch.float32)
    padded[:out_features] = weight
    return padded.view(blocks, block_cols, in_features).transpose(1, 2).contiguous().view(-1)


def row_gemm_reference(inputs: torch.Tensor, packed: torch.Tensor, out_features: int, block_cols: int, max_rows: int) -> torch.Tensor:
    """row_gemm: inputs [R, K] times the packed weight -> [R, out_features], block by block, max_rows rows at a time."""
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
