"""The row_gemm kernel's logic on any CPU, and what runs when the kernel is unavailable.

``tests/row_gemm_reference.py`` reads packed buffers with the kernel's layout and blocking in
PyTorch. Here it must equal a plain matmul; where the kernel runs, the kernel's packed buffers
must be bit-identical to the reference's and its products agree with it; and the packed paths
of ``medusa_lite.cpu.prepack`` and ``DraftLMHead`` (row ranges, bias, reshapes, stale copies, exact
greedy decoding) run with the reference standing in for the compiled kernel. Finally, on the oneDNN
fallback (kernel unavailable) the draft head stays unpacked.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from row_gemm_cases import ROWS, SHAPES, assert_within_rounding
from row_gemm_reference import kernel_constants, pack_reference, row_gemm_reference
from tiny_checkpoint import save_tiny_checkpoint
from tiny_models import plain_greedy, random_heads, tiny_base_model
from transformers import AutoModelForCausalLM

import medusa_lite.cpu.kernels as kernels
import medusa_lite.cpu.prepack as prepack
import medusa_lite.drafters.draft_vocab
from medusa_lite import MedusaModel, generate
from medusa_lite.artifacts.loading import load
from medusa_lite.drafters.draft_vocab import DraftLMHead

VARIANT_BLOCKING = kernel_constants()
# Each variant's blocking, and one more that moves the block and row-group edges around the shapes.
BLOCKINGS = sorted(set(VARIANT_BLOCKING.values())) + [(8, 1)]
# The reference stands in for the variant a machine without AVX-512 runs.
BLOCK_COLS, MAX_ROWS = VARIANT_BLOCKING[kernels.AVX2]
PACKED_ROWS = 8
VOCAB_SIZE = 96


@pytest.mark.parametrize("block_cols, max_rows", BLOCKINGS)
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_reference_reads_the_packed_layout_like_a_matmul(out_features, in_features, block_cols, max_rows):
    generator = torch.Generator().manual_seed(out_features * in_features + block_cols)
    weight = torch.randn(out_features, in_features, generator=generator)
    packed = pack_reference(weight, block_cols)
    assert packed.numel() == -(-out_features // block_cols) * block_cols * in_features
    for rows in ROWS:
        inputs = torch.randn(rows, in_features, generator=generator)
        assert_within_rounding(row_gemm_reference(inputs, packed, out_features, block_cols, max_rows), inputs, weight)


def test_reference_constants_come_from_the_source():
    source = (
        "#if defined(__AVX512F__) && defined(__FMA__)\n#define LANES 16\n#define VECTORS 2\n#define MAX_ROWS 6\n"
        "#elif defined(__AVX2__) && defined(__FMA__)\n#define LANES 8\n#define VECTORS 3\n#define MAX_ROWS 4\n#endif\n"
        "#define BLOCK_COLS (LANES * VECTORS)   /* c */\n"
    )
    assert kernel_constants(source) == {"avx512": (32, 6), "avx2": (24, 4)}
    with pytest.raises(AssertionError, match="avx2 branch no longer defines MAX_ROWS"):
        kernel_constants(source.replace("#define MAX_ROWS 4\n", ""))


@pytest.mark.parametrize("variant", list(VARIANT_BLOCKING))
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_kernel_packs_and_multiplies_like_the_reference(variant, out_features, in_features):
    reason = kernels.variant_unavailable_reason(variant)
    if reason is not None:
        pytest.skip(f"row_gemm {variant} variant unavailable: {reason}")
    block_cols, max_rows = VARIANT_BLOCKING[variant]
    library = kernels.row_gemm_library(variant)
    assert (library.row_gemm_block_cols(), library.row_gemm_max_rows()) == (block_cols, max_rows)
    generator = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    packed = kernels.pack_for_row_gemm(weight, variant)
    assert torch.equal(packed, pack_reference(weight, block_cols)), (
        "the kernel's packed layout differs from the reference's"
    )
    for rows in ROWS:
        inputs = torch.randn(rows, in_features, generator=generator)
        expected = row_gemm_reference(inputs, packed, out_features, block_cols, max_rows)
        torch.testing.assert_close(
            kernels.row_gemm(inputs, packed, out_features, variant), expected, rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("variant", list(VARIANT_BLOCKING))
@pytest.mark.parametrize("out_features, in_features", SHAPES)
def test_kernel_multiplies_a_bfloat16_packed_copy_like_the_reference_of_its_rounded_weights(
    variant, out_features, in_features
):
    """The bfloat16 copy is the float32 packing rounded to nearest even, and the kernel widens each value exactly:
    its products are float32 products by the rounded weights."""
    reason = kernels.variant_unavailable_reason(variant)
    if reason is not None:
        pytest.skip(f"row_gemm {variant} variant unavailable: {reason}")
    block_cols, max_rows = VARIANT_BLOCKING[variant]
    generator = torch.Generator().manual_seed(out_features + 3 * in_features)
    weight = torch.randn(out_features, in_features, generator=generator)
    packed = kernels.pack_for_row_gemm(weight, variant, dtype=torch.bfloat16)
    assert packed.dtype == torch.bfloat16
    assert torch.equal(packed, pack_reference(weight, block_cols).to(torch.bfloat16))
    rounded = weight.to(torch.bfloat16).float()
    for rows in ROWS:
        inputs = torch.randn(rows, in_features, generator=generator)
        output = kernels.row_gemm(inputs, packed, out_features, variant)
        assert_within_rounding(output, inputs, rounded)  # not within it of the float32 weights' products


@pytest.fixture
def reference_kernel(monkeypatch) -> list[int]:
    """The reference stands in for the compiled kernel wherever medusa_lite calls it; records the rows multiplied."""
    calls: list[int] = []

    def pack(weight: torch.Tensor, variant=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return pack_reference(weight.detach().float(), BLOCK_COLS).to(dtype)

    def multiply(inputs: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
        calls.append(inputs.shape[0])
        return row_gemm_reference(inputs.contiguous(), packed.float(), out_features, BLOCK_COLS, MAX_ROWS)

    monkeypatch.setattr(prepack, "pack_for_row_gemm", pack)
    monkeypatch.setattr(prepack, "row_gemm", multiply)
    monkeypatch.setattr(medusa_lite.drafters.draft_vocab, "pack_for_row_gemm", pack)
    monkeypatch.setattr(prepack, "row_gemm_available", lambda: True)
    monkeypatch.setattr(prepack, "row_gemm_unavailable_reason", lambda: None)
    return calls


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_prepacked_linear_row_gemm_path_on_the_reference(reference_kernel, bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(37, 50, bias=bias)
    packed = prepack.PrepackedLinear(linear, PACKED_ROWS, prepack.ROW_GEMM)
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in range(1, PACKED_ROWS + 3):
            inputs = torch.randn(1, rows, 37, generator=generator)  # [batch, tokens, features], as inside a model
            torch.testing.assert_close(
                packed(inputs), F.linear(inputs, linear.weight, linear.bias), rtol=1e-5, atol=1e-5
            )
    assert reference_kernel == list(range(prepack.MIN_PACKED_ROWS, PACKED_ROWS + 1)), (
        "rows outside the packed range took the packed path"
    )
    with torch.inference_mode():
        linear.weight.mul_(2.0)  # a changed weight: its stale packed copy must not be used
        inputs = torch.randn(3, 37, generator=generator)
        assert torch.equal(packed(inputs), F.linear(inputs, linear.weight, linear.bias))
    assert len(reference_kernel) == PACKED_ROWS - 1


def test_greedy_on_a_reference_packed_model_matches_plain_greedy(reference_kernel):
    """Tree verification through the packed path, then plain decoding through its one-row path: both exact."""
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE, seed=3)
    prompt = torch.randint(0, VOCAB_SIZE, (1, 7), generator=torch.Generator().manual_seed(4))
    expected = plain_greedy(base, prompt, 20)
    assert prepack.prepack_linears(base, PACKED_ROWS, prepack.ROW_GEMM) > 0
    model = MedusaModel(base, random_heads(base, num_heads=3))
    out = generate(model, prompt, 20, tree=[(0,), (1,), (0, 0), (0, 0, 0)])
    assert torch.equal(out.sequences, expected)
    assert reference_kernel and min(reference_kernel) >= prepack.MIN_PACKED_ROWS, (
        "verification never took the packed path"
    )
    reference_kernel.clear()
    with prepack.packed_from_rows(base, 1):  # one-token decoding through the kernel too
        assert torch.equal(plain_greedy(base, prompt, 20), expected)
    assert 1 in reference_kernel, "one-row decoding never took the packed path"


def test_a_bfloat16_packed_linear_multiplies_by_its_rounded_weights_on_the_reference(reference_kernel):
    torch.manual_seed(0)
    linear = torch.nn.Linear(37, 50)
    packed = prepack.PrepackedLinear(linear, PACKED_ROWS, prepack.ROW_GEMM, min_rows=1, packed_dtype=torch.bfloat16)
    assert packed.packed_weight.dtype == torch.bfloat16 and "packed_dtype=bfloat16" in repr(packed)
    rounded = linear.weight.detach().to(torch.bfloat16).float()
    inputs = torch.randn(5, 37, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        torch.testing.assert_close(packed(inputs), F.linear(inputs, rounded, linear.bias), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(packed(inputs), linear(inputs), rtol=1e-5, atol=1e-5)
    assert reference_kernel == [5, 5]
    with pytest.raises(ValueError, match="only the row_gemm backend packs to torch.bfloat16"):
        prepack.PrepackedLinear(linear, PACKED_ROWS, prepack.ONEDNN, packed_dtype=torch.bfloat16)


def test_draft_lm_head_on_the_reference(reference_kernel):
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE)
    head = DraftLMHead(base.lm_head, torch.arange(0, VOCAB_SIZE, 3))
    head.pack_for_few_rows(4)
    hidden = torch.randn(6, base.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for rows in (1, 4, 6):
            torch.testing.assert_close(head(hidden[:rows]), F.linear(hidden[:rows], head.weight), rtol=1e-5, atol=1e-5)
    assert reference_kernel == [1, 4], "the draft head's packed path ran for the wrong row counts"


def test_the_draft_head_stays_unpacked_on_the_onednn_fallback(tmp_path, monkeypatch):
    """Kernel unavailable: the target goes through oneDNN (where PyTorch has it), the draft projection not at all."""
    monkeypatch.setattr(prepack, "row_gemm_available", lambda: False)
    monkeypatch.setattr(prepack, "row_gemm_unavailable_reason", lambda: "the CPU lacks AVX-512 (test)")
    model_dir = save_tiny_checkpoint(tmp_path)[0]
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    heads = MedusaModel.with_new_heads(base, 2, draft_token_ids=torch.arange(base.config.vocab_size // 2)).heads
    heads.save_pretrained(tmp_path / "draft_heads")
    model, _ = load(model_dir, heads=tmp_path / "draft_heads")
    assert model.draft_lm_head is not None, "the heads should have a draft vocabulary"
    expected_backend = prepack.ONEDNN if prepack.onednn_available() else None
    assert prepack.prepack_backend(model.base_model) == expected_backend
    assert model.draft_lm_head.packed_weight is None and model.draft_lm_head.packed_rows == 0
    prompt = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(generate(model, prompt, 12).sequences, plain_greedy(model.base_model, prompt, 12))
