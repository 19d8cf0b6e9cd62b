"""``medusa_lite.cpu.kernels``: the few-row float32 GEMM kernel (built with the system compiler) and its fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from row_gemm_cases import ROWS, SHAPES, assert_within_rounding
from tiny_models import tiny_base_model

import medusa_lite.cpu.kernels as kernels
import medusa_lite.cpu.prepack as prepack
from medusa_lite.errors import UnsupportedModelError

FLOAT32_TOLERANCE = dict(rtol=1e-5, atol=1e-5)

needs_kernel = pytest.mark.skipif(
    kernels.row_gemm_unavailable_reason() is not None,
    reason=f"row_gemm unavailable: {kernels.row_gemm_unavailable_reason()}",
)


@needs_kernel
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_row_gemm_matches_f_linear(out_features, in_features):
    generator = torch.Generator().manual_seed(out_features * in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    packed = kernels.pack_for_row_gemm(weight)
    for rows in ROWS:
        inputs = torch.randn(rows, in_features, generator=generator)
        output = kernels.row_gemm(inputs, packed, out_features)
        assert output.shape == (rows, out_features)
        assert_within_rounding(output, inputs, weight)


@needs_kernel
def test_row_gemm_takes_non_contiguous_inputs_and_leaves_them_unchanged():
    weight = torch.randn(50, 37)
    inputs = torch.randn(37, 6).t()
    before = inputs.clone()
    torch.testing.assert_close(
        kernels.row_gemm(inputs, kernels.pack_for_row_gemm(weight), 50), F.linear(inputs, weight), **FLOAT32_TOLERANCE
    )
    assert torch.equal(inputs, before)


@needs_kernel
def test_row_gemm_refuses_inputs_that_do_not_fit_the_packed_weight():
    packed = kernels.pack_for_row_gemm(torch.randn(50, 37))
    with pytest.raises(ValueError, match="do not fit a packed weight"):
        kernels.row_gemm(torch.randn(3, 36), packed, 50)
    with pytest.raises(ValueError, match="do not fit a packed weight"):
        kernels.row_gemm(torch.randn(3, 37, dtype=torch.float64), packed, 50)
    with pytest.raises(ValueError, match="float32 CPU weights"):
        kernels.pack_for_row_gemm(torch.randn(4, 4, dtype=torch.bfloat16))


@needs_kernel
def test_the_library_is_built_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_LITE_CACHE", str(tmp_path))
    path = kernels.library_path()
    assert path.parent == tmp_path / "kernels" and not path.exists()
    kernels.build_library(path)
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left


def test_a_missing_compiler_is_reported_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(kernels.KernelBuildError, match="cannot run the C compiler .*no-such-cc"):
        kernels.build_library(tmp_path / "lib.so")
    monkeypatch.setattr(kernels, "compiler", lambda: None)
    with pytest.raises(kernels.KernelBuildError, match="no C compiler"):
        kernels.build_library(tmp_path / "lib.so")


def test_without_the_kernel_prepacking_falls_back_to_onednn(monkeypatch):
    monkeypatch.setattr(prepack, "row_gemm_available", lambda: False)
    monkeypatch.setattr(prepack, "row_gemm_unavailable_reason", lambda: "the CPU lacks AVX-512 (test)")
    base = tiny_base_model("llama", vocab_size=64)
    if prepack.onednn_available():
        assert prepack.default_backend() == prepack.ONEDNN
        prepack.prepack_linears(base, 6)
        assert prepack.prepack_backend(base) == prepack.ONEDNN
        with pytest.raises(UnsupportedModelError, match="AVX-512"):
            prepack.prepack_linears(base, 6, prepack.ROW_GEMM)
    monkeypatch.setattr(prepack, "onednn_available", lambda: False)
    assert prepack.default_backend() is None and not prepack.prepack_supported(base)
    with pytest.raises(UnsupportedModelError, match="row_gemm kernel is unavailable \\(the CPU lacks AVX-512"):
        prepack.prepack_linears(base, 6)
