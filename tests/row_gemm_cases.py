"""The shapes the row_gemm kernel is tested on and the float32 rounding bound its output must meet."""

import torch

UNIT_ROUNDOFF = 2.0**-24  # float32
# Output sizes around the kernel's 48-column blocks and its 16-wide vectors; odd input sizes.
SHAPES = [(1, 1), (17, 5), (48, 64), (50, 37), (100, 576), (97, 129)]
ROWS = [1, 2, 3, 5, 8, 9, 16, 19]  # up to and past the kernel's 8 rows per pass


def assert_within_rounding(output: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor) -> None:
    """|output - exact| <= K * u * (|inputs| @ |weight|^T): the classic bound for a float32 sum of K products."""
    exact = inputs.double() @ weight.double().T
    bound = inputs.shape[1] * UNIT_ROUNDOFF * (inputs.double().abs() @ weight.double().abs().T)
    error = (output.double() - exact).abs()
    assert bool((error <= bound).all()), f"error {float((error - bound).max()):.3g} above the rounding bound"
