"""Bad arguments to generate: each gets its own exception type and a message naming the problem."""

import math

import pytest
import torch
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import GenerationInputError, MedusaModel, UnsupportedModelError, generate


@pytest.fixture(scope="module")
def model():
    base = tiny_base_model("llama", vocab_size=64, seed=1)
    return MedusaModel(base, random_heads(base, num_heads=3))


PROMPT = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), "temperature must be a finite number >= 0"),
        (dict(temperature=math.nan), "temperature must be a finite number >= 0"),
        (dict(temperature=math.inf), "temperature must be a finite number >= 0"),
        (dict(temperature=1.0, top_p=0.0), "top_p must be in (0, 1]"),
        (dict(temperature=1.0, top_p=1.5), "top_p must be in (0, 1]"),
        (dict(temperature=1.0, top_p=math.nan), "top_p must be in (0, 1]"),
        (dict(temperature=1.0, top_k=0), "top_k must be a positive integer"),
        (dict(temperature=1.0, top_k=-3), "top_k must be a positive integer"),
        (dict(temperature=1.0, top_k=2.5), "top_k must be a positive integer"),
    ],
)
def test_bad_sampling_settings(model, kwargs, message):
    with pytest.raises(
        GenerationInputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")
    ):
        generate(model, PROMPT, 5, **kwargs)


def test_empty_prompt(model):
    with pytest.raises(GenerationInputError, match="prompt is empty"):
        generate(model, torch.tensor([[]], dtype=torch.long), 5)


def test_a_right_padded_batch(model):
    with pytest.raises(GenerationInputError, match=r"row\(s\) \[1\] have padding after their first token"):
        generate(model, torch.tensor([[1, 2], [3, 4]]), 5, attention_mask=torch.tensor([[1, 1], [1, 0]]))


def test_float_token_ids(model):
    with pytest.raises(GenerationInputError, match="integer token ids, got dtype torch.float32"):
        generate(model, torch.tensor([[1.0, 2.0]]), 5)


def test_text_instead_of_token_ids(model):
    with pytest.raises(GenerationInputError, match="input_ids must be token ids, got text .* tokenize the text first"):
        generate(model, "hello", 5)


def test_three_dimensional_ids(model):
    with pytest.raises(GenerationInputError, match=r"shape \[batch, length\] or \[length\]"):
        generate(model, torch.ones(1, 1, 3, dtype=torch.long), 5)


@pytest.mark.parametrize("token", [-1, 64, 1000])
def test_token_outside_vocabulary(model, token):
    with pytest.raises(GenerationInputError, match=f"token id {token}, outside the model's vocabulary"):
        generate(model, torch.tensor([[1, token]]), 5)


@pytest.mark.parametrize("value", [-1, 2.0, True])
def test_bad_max_new_tokens(model, value):
    with pytest.raises(GenerationInputError, match="max_new_tokens must be an integer >= 0"):
        generate(model, PROMPT, value)


def test_zero_new_tokens_returns_prompt_without_calling_the_model(model):
    calls = []
    handle = model.base_model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        out = generate(model, PROMPT, 0)
    finally:
        handle.remove()
    assert torch.equal(out.sequences, PROMPT) and calls == [] and out.stats.target_calls == 0


def test_int32_ids_are_accepted(model):
    a = generate(model, PROMPT.to(torch.int32), 6).sequences
    assert a.dtype == torch.long and torch.equal(a, generate(model, PROMPT, 6).sequences)


def test_heads_in_another_dtype_are_cast_to_the_model():
    base = tiny_base_model("llama", vocab_size=64, seed=1)
    heads = random_heads(base, num_heads=2).to(torch.float64)
    model = MedusaModel(base, heads)
    assert next(model.heads.parameters()).dtype == torch.float32
    expected = plain_greedy(base, PROMPT, 8)
    assert torch.equal(generate(model, PROMPT, 8).sequences, expected)


def test_attention_without_custom_masks_is_rejected_up_front(model):
    model.base_model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(UnsupportedModelError, match="cannot take the custom 4D tree attention mask"):
            generate(model, PROMPT, 5)
    finally:
        model.base_model.config._attn_implementation = "sdpa"
