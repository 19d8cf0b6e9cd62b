"""``medusa_lite.cpu.prepack``: few-row products for tree verification on CPU (the row_gemm kernel
and oneDNN), and ``load(prepack=...)``. Every packed-path test runs once per backend this machine has."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import training_fixtures
from tiny_checkpoint import save_tiny_checkpoint
from tiny_models import TINY_SIZES, plain_greedy, random_heads, tiny_base_model
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig

import medusa_lite.cpu.prepack
from medusa_lite import MedusaError, MedusaModel, Tree, UnsupportedModelError, generate
from medusa_lite.artifacts.loading import load
from medusa_lite.bench.measure import machine_info
from medusa_lite.cli import build_parser, main
from medusa_lite.commands.options import prepack_choice
from medusa_lite.cpu.kernels import row_gemm_unavailable_reason
from medusa_lite.cpu.prepack import (
    MIN_PACKED_ROWS,
    ONEDNN,
    ROW_GEMM,
    PrepackedLinear,
    default_backend,
    onednn_available,
    packed_from_rows,
    packed_up_to_rows,
    prepack_backend,
    prepack_linears,
    prepack_supported,
    prepacked_rows,
    unpack_linears,
)
from medusa_lite.decoding.generate import DEFAULT_LOOKUP_TOKENS
from medusa_lite.drafters.draft_vocab import DraftLMHead

pytestmark = pytest.mark.skipif(
    default_backend() is None, reason="neither the row_gemm kernel nor oneDNN is available"
)

IN_FEATURES, OUT_FEATURES = 24, 40
PACKED_ROWS = 8
ROW_COUNTS = range(1, PACKED_ROWS + 3)  # below, inside and above the packed range
FLOAT32_TOLERANCE = dict(rtol=1e-5, atol=1e-5)
WIDE_TREE = Tree.from_paths([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])
VOCAB_SIZE = 96
NUM_PROMPTS = 4
MAX_NEW_TOKENS = 30


# One torch thread (autouse): these checks are about values, and a busy CPU slows threaded GEMMs
# many times over.
single_thread = training_fixtures.single_thread


@pytest.fixture(params=[ROW_GEMM, ONEDNN])
def backend(request) -> str:
    """Each packed path in turn, skipped where this machine lacks it."""
    if request.param == ROW_GEMM and row_gemm_unavailable_reason() is not None:
        pytest.skip(f"row_gemm kernel unavailable: {row_gemm_unavailable_reason()}")
    if request.param == ONEDNN and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN linear")
    return request.param


# The function each backend's packed path calls, first argument the rows it multiplies.
BACKEND_FUNCTION = {ROW_GEMM: "row_gemm", ONEDNN: "onednn_linear"}


@pytest.fixture
def packed_calls(monkeypatch, backend) -> list[int]:
    """The row count of every packed multiplication made during the test."""
    calls: list[int] = []
    original = getattr(medusa_lite.cpu.prepack, BACKEND_FUNCTION[backend])

    def counted(inputs, *rest):
        calls.append(inputs.shape[0])
        return original(inputs, *rest)

    monkeypatch.setattr(medusa_lite.cpu.prepack, BACKEND_FUNCTION[backend], counted)
    return calls


def linear_layer(bias: bool) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(IN_FEATURES, OUT_FEATURES, bias=bias)


def layers_of_type(model: nn.Module, kind: type) -> list[nn.Module]:
    return [module for module in model.modules() if type(module) is kind]


def tiny_tied_model() -> nn.Module:
    """A tiny fp32 llama whose lm_head shares the input embedding's weight."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        **TINY_SIZES,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32).eval()


def weight_pointers(model: nn.Module) -> dict[str, int]:
    return {name: tensor.data_ptr() for name, tensor in model.state_dict().items()}


def spy_on(monkeypatch, module_name: str, function: Callable) -> list[dict]:
    """Record the keyword arguments of every call of ``module_name.<function>``, still calling it."""
    calls: list[dict] = []

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return function(*args, **kwargs)

    monkeypatch.setattr(f"{module_name}.{function.__name__}", spy)
    return calls


# -- PrepackedLinear ---------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_prepacked_linear_matches_f_linear_for_every_row_count(bias, backend, packed_calls):
    linear = linear_layer(bias)
    packed = PrepackedLinear(linear, PACKED_ROWS, backend)
    packed_range = range(MIN_PACKED_ROWS, PACKED_ROWS + 1)
    assert packed.weight is linear.weight and packed.bias is linear.bias
    assert set(packed.state_dict()) == set(linear.state_dict())  # the packed copy is not saved
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for rows in ROW_COUNTS:
            flat = torch.randn(rows, IN_FEATURES, generator=generator)
            for inputs in (flat[None], flat):
                expected = F.linear(inputs, linear.weight, linear.bias)
                calls_before = len(packed_calls)
                output = packed(inputs)
                assert output.shape == expected.shape
                if rows in packed_range:
                    assert packed_calls[calls_before:] == [rows], f"{rows} rows: packed path not taken"
                    torch.testing.assert_close(output, expected, **FLOAT32_TOLERANCE)
                else:
                    assert len(packed_calls) == calls_before, f"{rows} rows: packed path taken"
                    assert torch.equal(output, expected), f"{rows} rows: plain path not bit-identical"


def test_prepacked_linear_handles_non_contiguous_and_batched_inputs(backend, packed_calls):
    linear = linear_layer(bias=True)
    packed = PrepackedLinear(linear, PACKED_ROWS, backend)
    transposed = torch.randn(IN_FEATURES, PACKED_ROWS).t()
    batched = torch.randn(2, PACKED_ROWS // 2, IN_FEATURES)  # [batch, tokens, features]: the rows of both
    assert not transposed.is_contiguous()
    with torch.inference_mode():
        for inputs in (transposed, batched):
            expected = F.linear(inputs, linear.weight, linear.bias)
            torch.testing.assert_close(packed(inputs), expected, **FLOAT32_TOLERANCE)
    assert packed_calls == [PACKED_ROWS, PACKED_ROWS], "the packed path was not taken"


def test_gradients_take_the_plain_path(backend, packed_calls):
    linear = linear_layer(bias=True)
    packed = PrepackedLinear(linear, PACKED_ROWS, backend)
    inputs = torch.randn(1, PACKED_ROWS - 1, IN_FEATURES, requires_grad=True)
    with torch.enable_grad():
        packed(inputs).square().sum().backward()
    assert packed_calls == []
    packed_grads = [inputs.grad.clone(), linear.weight.grad.clone(), linear.bias.grad.clone()]
    inputs.grad = linear.weight.grad = linear.bias.grad = None
    F.linear(inputs, linear.weight, linear.bias).square().sum().backward()
    for packed_grad, plain_grad in zip(packed_grads, [inputs.grad, linear.weight.grad, linear.bias.grad]):
        assert torch.equal(packed_grad, plain_grad)
    with torch.no_grad():
        packed(inputs)
    assert packed_calls == [PACKED_ROWS - 1]  # without grad the same input takes the packed path


# -- prepack_linears / unpack_linears ----------------------------------------------------------
def test_prepack_linears_swaps_layers_and_keeps_parameters(backend):
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE)
    num_linears = len(layers_of_type(base, nn.Linear))
    state = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    pointers = weight_pointers(base)
    assert prepacked_rows(base) is None

    assert prepack_linears(base, PACKED_ROWS, backend) == num_linears
    assert len(layers_of_type(base, PrepackedLinear)) == num_linears and not layers_of_type(base, nn.Linear)
    assert prepacked_rows(base) == PACKED_ROWS and prepack_backend(base) == backend
    assert weight_pointers(base) == pointers
    assert all(torch.equal(tensor, state[name]) for name, tensor in base.state_dict().items())

    repacked_rows = PACKED_ROWS + 4
    assert prepack_linears(base, repacked_rows, backend) == num_linears
    layers = layers_of_type(base, PrepackedLinear)
    assert len(layers) == num_linears and all(
        layer.rows == repacked_rows and not list(layer.children()) for layer in layers
    )
    assert weight_pointers(base) == pointers

    unpack_linears(base)
    assert len(layers_of_type(base, nn.Linear)) == num_linears and not layers_of_type(base, PrepackedLinear)
    assert prepacked_rows(base) is None and weight_pointers(base) == pointers


def test_rows_below_the_minimum_unpack(backend):
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE)
    prepack_linears(base, PACKED_ROWS, backend)
    assert prepack_linears(base, MIN_PACKED_ROWS - 1, backend) == 0
    assert prepacked_rows(base) is None and not layers_of_type(base, PrepackedLinear)


def test_tied_weights_stay_tied_and_outputs_agree(backend):
    model = tiny_tied_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    tokens = torch.randint(0, VOCAB_SIZE, (1, PACKED_ROWS - 2), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        one_token, several = model(tokens[:, :1]).logits, model(tokens).logits
    prepack_linears(model, PACKED_ROWS, backend)
    assert isinstance(model.lm_head, PrepackedLinear) and model.lm_head.weight is model.model.embed_tokens.weight
    assert list(model.state_dict()) == list(tiny_tied_model().state_dict())
    with torch.inference_mode():
        assert torch.equal(model(tokens[:, :1]).logits, one_token)
        torch.testing.assert_close(model(tokens).logits, several, **FLOAT32_TOLERANCE)
    unpack_linears(model)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.model.embed_tokens.weight


def test_bfloat16_model_is_refused_with_a_clear_error():
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE).to(torch.bfloat16)
    assert not prepack_supported(base)
    with pytest.raises(UnsupportedModelError, match="bfloat16, not float32"):
        prepack_linears(base, PACKED_ROWS)
    assert issubclass(UnsupportedModelError, ValueError)
    unpack_linears(base)  # unpacking needs no backend
    assert not layers_of_type(base, PrepackedLinear)


def require_row_gemm() -> None:
    if row_gemm_unavailable_reason() is not None:
        pytest.skip(f"row_gemm kernel unavailable: {row_gemm_unavailable_reason()}")


def test_packed_from_rows_sends_one_row_through_the_packed_path_and_restores_the_minimum(backend, packed_calls):
    linear = linear_layer(bias=True)
    packed = PrepackedLinear(linear, PACKED_ROWS, backend)
    one_row = torch.randn(1, IN_FEATURES, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(packed(one_row), F.linear(one_row, linear.weight, linear.bias)) and packed_calls == []
        with packed_from_rows(packed, 1):
            torch.testing.assert_close(
                packed(one_row), F.linear(one_row, linear.weight, linear.bias), **FLOAT32_TOLERANCE
            )
        assert packed_calls == [1]
        packed(one_row)
    assert packed_calls == [1] and packed.min_rows == MIN_PACKED_ROWS, "the minimum was not restored"


def test_packed_up_to_rows_serves_a_batch_of_rows_and_restores_the_bound(backend, packed_calls):
    linear = linear_layer(bias=True)
    packed = PrepackedLinear(linear, PACKED_ROWS, backend)
    many = torch.randn(3 * PACKED_ROWS, IN_FEATURES, generator=torch.Generator().manual_seed(4))
    expected = F.linear(many, linear.weight, linear.bias)
    with torch.inference_mode():
        assert torch.equal(packed(many), expected) and packed_calls == [], "past the bound: PyTorch's path"
        with pytest.raises(RuntimeError, match="inside"), packed_up_to_rows(packed, 3 * PACKED_ROWS):
            torch.testing.assert_close(packed(many), expected, **FLOAT32_TOLERANCE)
            assert packed_calls == [3 * PACKED_ROWS]
            with packed_up_to_rows(packed, 2):  # a lower bound never narrows the packed range
                packed(many)
            raise RuntimeError("inside")
        assert packed_calls == [3 * PACKED_ROWS] * 2 and packed.rows == PACKED_ROWS, "the bound was not restored"
        packed(many)
    assert len(packed_calls) == 2


def test_packed_from_rows_restores_the_minimum_after_an_error(backend):
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE)
    prepack_linears(base, PACKED_ROWS, backend)
    with pytest.raises(RuntimeError, match="inside"):
        with packed_from_rows(base, 1):
            raise RuntimeError("inside")
    assert {layer.min_rows for layer in layers_of_type(base, PrepackedLinear)} == {MIN_PACKED_ROWS}


def test_packed_from_rows_refuses_what_it_cannot_do():
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE)
    with pytest.raises(UnsupportedModelError, match="not pre-packed"):
        with packed_from_rows(base, 1):
            pass
    with pytest.raises(ValueError, match="at least 1"):
        with packed_from_rows(base, 0):
            pass


def test_greedy_through_the_one_row_packed_path_matches_plain_greedy(backend):
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE, seed=3)
    prompt = torch.randint(0, VOCAB_SIZE, (1, 7), generator=torch.Generator().manual_seed(4))
    expected = plain_greedy(base, prompt, MAX_NEW_TOKENS)
    prepack_linears(base, PACKED_ROWS, backend)
    with packed_from_rows(base, 1):
        assert torch.equal(plain_greedy(base, prompt, MAX_NEW_TOKENS), expected)


def test_draft_lm_head_packs_for_the_heads_rows(monkeypatch):
    """The heads' projection onto their draft vocabulary: the kernel for up to one row per head, else the usual
    path.
    """
    require_row_gemm()
    calls = []
    original = medusa_lite.cpu.prepack.row_gemm
    monkeypatch.setattr(
        medusa_lite.cpu.prepack,
        "row_gemm",
        lambda inputs, packed, out: calls.append(inputs.shape[0]) or original(inputs, packed, out),
    )
    base = tiny_base_model("llama", vocab_size=VOCAB_SIZE)
    head = DraftLMHead(base.lm_head, torch.arange(0, VOCAB_SIZE, 3))
    head.pack_for_few_rows(4)
    hidden = torch.randn(6, base.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        for rows in (1, 4):
            torch.testing.assert_close(head(hidden[:rows]), F.linear(hidden[:rows], head.weight), **FLOAT32_TOLERANCE)
        assert calls == [1, 4]
        assert torch.equal(head(hidden), F.linear(hidden, head.weight)) and calls == [1, 4], (
            "more rows than packed for"
        )
    assert torch.equal(head(hidden[:2]), F.linear(hidden[:2], head.weight)) and calls == [1, 4], (
        "gradients take the usual path"
    )
    with torch.inference_mode():
        head.weight.mul_(2.0)
        assert torch.equal(head(hidden[:2]), F.linear(hidden[:2], head.weight)) and calls == [1, 4], (
            "a stale packed copy was used"
        )


def test_load_packs_the_draft_projection_with_the_target(tmp_path):
    require_row_gemm()
    model_dir = save_tiny_checkpoint(tmp_path)[0]
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    heads = MedusaModel.with_new_heads(base, 2, draft_token_ids=torch.arange(VOCAB_SIZE // 2)).heads
    heads.save_pretrained(tmp_path / "draft_heads")
    model, _ = load(model_dir, heads=tmp_path / "draft_heads")
    assert model.draft_lm_head.packed_rows == model.num_heads and model.draft_lm_head.packed_weight is not None
    unpacked_model, _ = load(model_dir, heads=tmp_path / "draft_heads", prepack=False)
    assert unpacked_model.draft_lm_head.packed_weight is None


# -- exactness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_on_a_prepacked_model_matches_plain_greedy(family, backend, packed_calls):
    base = tiny_base_model(family, vocab_size=VOCAB_SIZE, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4), tree=WIDE_TREE)
    generator = torch.Generator().manual_seed(5)
    prompts = [
        torch.randint(0, VOCAB_SIZE, (1, int(torch.randint(1, 20, (1,), generator=generator))), generator=generator)
        for _ in range(NUM_PROMPTS)
    ]
    expected = [plain_greedy(base, prompt, MAX_NEW_TOKENS) for prompt in prompts]  # before packing

    rows = WIDE_TREE.num_nodes + DEFAULT_LOOKUP_TOKENS
    prepack_linears(base, rows, backend)
    for prompt, reference in zip(prompts, expected):
        assert torch.equal(generate(model, prompt, MAX_NEW_TOKENS).sequences, reference), (
            f"{family}: diverged from plain greedy"
        )
    assert packed_calls, "verification never took the packed path"
    assert max(packed_calls) <= rows


# -- load and the commands ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, Path]:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("prepack"))


def test_load_prepacks_float32_on_cpu_by_default(checkpoint):
    model, _ = load(checkpoint[0], heads=checkpoint[1])
    expected_rows = model.tree.num_nodes + DEFAULT_LOOKUP_TOKENS
    assert expected_rows >= MIN_PACKED_ROWS
    assert prepacked_rows(model.base_model) == expected_rows and prepack_backend(model.base_model) == default_backend()
    assert not layers_of_type(model.base_model, nn.Linear), "a linear layer of the target was left unpacked"
    assert not layers_of_type(model.heads, PrepackedLinear), "the heads were packed"
    assert prepacked_rows(load(checkpoint[0], heads=checkpoint[1], prepack=True)[0].base_model) == expected_rows


def test_load_without_prepack_packs_nothing(checkpoint):
    model, _ = load(checkpoint[0], heads=checkpoint[1], prepack=False)
    assert prepacked_rows(model.base_model) is None and not layers_of_type(model, PrepackedLinear)
    bf16, _ = load(checkpoint[0], heads=checkpoint[1], dtype=torch.bfloat16)  # automatic: unsupported, no error
    assert prepacked_rows(bf16.base_model) is None


def test_load_refuses_prepack_on_an_unsupported_dtype(checkpoint):
    with pytest.raises(MedusaError, match="bfloat16") as error:
        load(checkpoint[0], heads=checkpoint[1], dtype=torch.bfloat16, prepack=True)
    assert isinstance(error.value, UnsupportedModelError)


def test_cli_no_prepack_flag_reaches_load(checkpoint, monkeypatch, capsys):
    assert prepack_choice(build_parser().parse_args([])) is None
    assert prepack_choice(build_parser().parse_args(["--no-prepack"])) is False
    loads = spy_on(monkeypatch, "medusa_lite.cli", load)
    common = ["--model", str(checkpoint[0]), "--heads", str(checkpoint[1]), "--max-new-tokens", "4", "--threads", "1"]
    assert main([*common, "--no-prepack"]) == 0 and main(common) == 0
    capsys.readouterr()
    assert [call["prepack"] for call in loads] == [False, None]


def test_machine_info_records_prepacked_rows(checkpoint):
    model, _ = load(checkpoint[0], heads=checkpoint[1])
    assert (
        machine_info(torch.float32, model.base_model)["prepacked_rows"] == prepacked_rows(model.base_model) is not None
    )
    assert machine_info(torch.float32, model.base_model)["prepack_backend"] == default_backend()
    assert "prepacked_rows" not in machine_info(torch.float32)  # the old call form still works
    unpack_linears(model.base_model)
    assert machine_info(torch.float32, model.base_model)["prepacked_rows"] is None


@pytest.mark.parametrize("flags", [[], ["--no-prepack"]], ids=["default", "no-prepack"])
def test_benchmark_records_prepacking(checkpoint, tmp_path, flags):
    from medusa_lite.commands import benchmark

    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text(
        json.dumps({"question_id": 1, "category": "qa", "turns": ["What is the capital city of France?"]}) + "\n"
    )
    out = tmp_path / "bench"
    args = [
        "--model",
        str(checkpoint[0]),
        "--heads",
        str(checkpoint[1]),
        "--questions",
        str(questions_file),
        "--methods",
        "heads",
    ]
    assert benchmark.main([*args, "--max-new-tokens", "4", "--threads", "1", "--out", str(out), *flags]) == 0
    results = json.loads((out / "results.json").read_text())
    expected = None if flags else results["tree_nodes"] + DEFAULT_LOOKUP_TOKENS
    assert results["machine"]["prepacked_rows"] == expected


def test_benchmark_plain_kernel_method(checkpoint, tmp_path):
    """``plain_kernel``: plain generate with one-row steps through the packed path, and the speculation's own
    speed-up."""
    from medusa_lite.commands import benchmark

    questions_file = tmp_path / "questions.jsonl"
    questions_file.write_text(
        json.dumps({"question_id": 1, "category": "qa", "turns": ["What is the capital city of France?"]}) + "\n"
    )
    args = [
        "--model",
        str(checkpoint[0]),
        "--heads",
        str(checkpoint[1]),
        "--questions",
        str(questions_file),
        "--methods",
        "plain_kernel",
        "heads",
    ]
    out = tmp_path / "bench"
    assert benchmark.main([*args, "--max-new-tokens", "6", "--threads", "1", "--out", str(out)]) == 0
    overall = json.loads((out / "results.json").read_text())["summary"]["overall"]
    kernel, heads = overall["plain_kernel"], overall["heads"]
    assert kernel["mean_accepted_tokens"] == 1.0 and kernel["new_tokens"] == overall["plain"]["new_tokens"]
    assert heads["speedup_vs_plain_kernel"] == pytest.approx(kernel["seconds"] / heads["seconds"])
    assert overall["plain"]["speedup_vs_plain_kernel"] == pytest.approx(
        kernel["seconds"] / overall["plain"]["seconds"]
    )
    assert f"heads only {heads['speedup_vs_plain_kernel']:.2f}x" in (out / "results.md").read_text()
    assert (
        main(
            [
                "benchmark",
                *args,
                "--max-new-tokens",
                "6",
                "--threads",
                "1",
                "--out",
                str(tmp_path / "no"),
                "--no-prepack",
            ]
        )
        == 2
    )


def test_a_changed_weight_is_never_multiplied_by_its_stale_packed_copy(backend, packed_calls):
    """In-place updates and dtype round trips leave the packed copy behind: the usual path takes over."""
    torch.manual_seed(0)
    layer = PrepackedLinear(nn.Linear(IN_FEATURES, OUT_FEATURES), PACKED_ROWS, backend)
    inputs = torch.randn(PACKED_ROWS, IN_FEATURES)
    with torch.no_grad():
        layer(inputs)
        assert packed_calls == [PACKED_ROWS]
        layer.weight.mul_(2.0)
        assert torch.equal(layer(inputs), F.linear(inputs, layer.weight, layer.bias))
        layer.to(torch.bfloat16).to(torch.float32)
        assert torch.equal(layer(inputs), F.linear(inputs, layer.weight, layer.bias))
    assert packed_calls == [PACKED_ROWS], "the packed path ran on a stale copy"
