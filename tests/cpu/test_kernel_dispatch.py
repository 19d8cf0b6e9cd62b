"""Which few-row kernel runs: ``MEDUSA_LITE_KERNEL`` and the CPU's features, decided in one place
(:func:`medusa_lite.cpu.kernels.kernel_path`), and every variant against ``F.linear``."""

from __future__ import annotations

import json

import pytest
import torch
from row_gemm_cases import ROWS, SHAPES, assert_within_rounding
from tiny_checkpoint import QUESTIONS, save_tiny_checkpoint

import medusa_lite.cpu.kernels as kernels
import medusa_lite.cpu.prepack as prepack
from medusa_lite.bench.measure import TimedRun, machine_info
from medusa_lite.cli import summary_line
from medusa_lite.commands import benchmark


@pytest.fixture
def fresh_choice(monkeypatch):
    """Clears the process's cached kernel choice before and after the test (it reads the environment once)."""
    kernels.kernel_path.cache_clear()
    yield monkeypatch
    kernels.kernel_path.cache_clear()


def runnable_variants() -> list[str]:
    return [variant for variant in kernels.VARIANT_FLAGS if kernels.variant_unavailable_reason(variant) is None]


@pytest.mark.parametrize("variant", list(kernels.VARIANT_FLAGS))
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_every_variant_matches_f_linear(variant, out_features, in_features):
    reason = kernels.variant_unavailable_reason(variant)
    if reason is not None:
        pytest.skip(f"{variant} cannot run here: {reason}")
    generator = torch.Generator().manual_seed(out_features * in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    packed = kernels.pack_for_row_gemm(weight, variant)
    assert packed.numel() == kernels.packed_size(out_features, in_features, variant)
    for rows in ROWS:  # past the variant's rows per pass (6 for avx2, 8 for avx512)
        inputs = torch.randn(rows, in_features, generator=generator)
        assert_within_rounding(kernels.row_gemm(inputs, packed, out_features, variant), inputs, weight)


def test_the_variants_pack_in_blocks_of_their_vector_width():
    widths = {kernels.AVX512: 48, kernels.AVX2: 16}
    variants = runnable_variants()
    if not variants:
        pytest.skip("no row_gemm variant runs on this CPU")
    for variant in variants:
        assert kernels.block_columns(variant) == widths[variant]
        assert kernels.variant_library(variant).row_gemm_max_rows() == {kernels.AVX512: 8, kernels.AVX2: 6}[variant]


def test_auto_takes_the_widest_variant_the_cpu_runs(fresh_choice):
    fresh_choice.delenv(kernels.KERNEL_ENV_VAR, raising=False)
    path = kernels.kernel_path()
    assert path.requested == kernels.AUTO
    variants = runnable_variants()
    assert path.variant == (variants[0] if variants else None)
    assert kernels.row_gemm_available() == bool(variants)


def test_off_turns_the_kernel_off_and_prepacking_falls_back(fresh_choice):
    fresh_choice.setenv(kernels.KERNEL_ENV_VAR, "off")
    path = kernels.kernel_path()
    assert path.variant is None and "turned off by MEDUSA_LITE_KERNEL" in path.reason
    assert not kernels.row_gemm_available()
    assert path.describe() == "off (MEDUSA_LITE_KERNEL=off: turned off by MEDUSA_LITE_KERNEL)"
    assert prepack.default_backend() == (prepack.ONEDNN if prepack.onednn_available() else None)
    with pytest.raises(kernels.KernelBuildError, match="turned off"):
        kernels.pack_for_row_gemm(torch.randn(4, 4))


@pytest.mark.parametrize("variant", list(kernels.VARIANT_FLAGS))
def test_a_forced_variant_is_used_when_the_cpu_runs_it(fresh_choice, variant):
    fresh_choice.setenv(kernels.KERNEL_ENV_VAR, variant.upper())  # case does not matter
    path = kernels.kernel_path()
    reason = kernels.variant_unavailable_reason(variant)
    assert path.requested == variant
    assert path.variant == (variant if reason is None else None)
    if reason is None:
        assert kernels.block_columns() == kernels.block_columns(variant)
        assert path.describe() == f"row_gemm {variant} (MEDUSA_LITE_KERNEL={variant})"
    else:
        assert path.reason == reason


def test_a_cpu_without_the_instructions_keeps_pytorchs_kernels(fresh_choice):
    """What an ARM machine (PyTorch reports DEFAULT, or NEON/SVE) gets: no variant, and why."""
    fresh_choice.delenv(kernels.KERNEL_ENV_VAR, raising=False)
    fresh_choice.setattr(kernels, "cpu_capability", lambda: "DEFAULT")
    path = kernels.kernel_path()
    assert path.variant is None
    assert "lacks AVX512" in path.reason and "lacks AVX2" in path.reason and "DEFAULT" in path.reason


def test_an_unknown_choice_is_a_clear_error(fresh_choice):
    fresh_choice.setenv(kernels.KERNEL_ENV_VAR, "sse4")
    with pytest.raises(
        kernels.KernelChoiceError, match="MEDUSA_LITE_KERNEL='sse4' is not one of auto, off, avx512, avx2"
    ):
        kernels.kernel_path()


def test_the_choice_is_what_results_and_the_summary_report(fresh_choice):
    fresh_choice.setenv(kernels.KERNEL_ENV_VAR, "off")
    info = machine_info(torch.float32)
    assert info["kernel"] == {"requested": "off", "variant": None, "reason": "turned off by MEDUSA_LITE_KERNEL"}
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    line = summary_line(TimedRun(torch.zeros(3, dtype=torch.long), 1.0), 1.5, "a tree", "float32")
    assert line.endswith("kernel off (MEDUSA_LITE_KERNEL=off: turned off by MEDUSA_LITE_KERNEL))")


def test_the_benchmark_records_the_kernel_it_was_told_to_use(tmp_path, fresh_choice):
    """``--kernel off``: results say the kernel was off; the packed path is oneDNN's (where PyTorch has it), so
    ``plain_kernel`` still splits its share from the speculation's."""
    fresh_choice.setenv(kernels.KERNEL_ENV_VAR, "auto")  # choose_kernel writes the variable; monkeypatch restores it
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS[:2]))
    out = tmp_path / "bench"
    args = [
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--questions",
        str(questions_file),
        "--methods",
        "medusa",
    ]
    assert (
        benchmark.main(
            [*args, "--kernel", "off", "--max-new-tokens", "6", "--dtype", "fp32", "--threads", "1", "--out", str(out)]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["machine"]["kernel"]["requested"] == "off" and results["machine"]["kernel"]["variant"] is None
    onednn = prepack.onednn_available()
    assert results["machine"]["prepack_backend"] == (prepack.ONEDNN if onednn else None)
    assert ("plain_kernel" in results["summary"]["overall"]) == onednn
