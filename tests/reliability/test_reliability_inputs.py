"""generate's arguments checked by meaning (medusa_lite.decoding.inputs): what is refused, what unusual valid input
gives.

Every refusal is a ``GenerationInputError``, so both ``except MedusaError`` and ``except ValueError``
catch it, and its message names the argument. Valid input in an unusual form (numpy scalars,
0-d tensors, a tokenizer's ``BatchEncoding``, a temperature near float32's minimum, a model left
in train mode) gives the same tokens as the plain form.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import plain_greedy, random_heads, tiny_base_model
from tiny_tokenizer import TINY_VOCAB_SIZE, make_tiny_tokenizer

from medusa_lite import GenerationInputError, MedusaError, MedusaModel, generate
from medusa_lite.decoding.inputs import check_generator

VOCAB = TINY_VOCAB_SIZE
NEW_TOKENS = 6
PROMPT = torch.tensor([[5, 17, 42, 9]])


@pytest.fixture(scope="module")
def model():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3, logit_scale=4.0)
    return MedusaModel(base, random_heads(base, num_heads=2))


@pytest.fixture(scope="module")
def expected(model):
    return generate(model, PROMPT, NEW_TOKENS).sequences


def refused(model, match: str, *args, **kwargs) -> GenerationInputError:
    """The error generate raises: a MedusaError and a ValueError whose message matches ``match``."""
    with pytest.raises(MedusaError, match=match) as caught:
        generate(model, *args, **kwargs)
    assert isinstance(caught.value, GenerationInputError) and isinstance(caught.value, ValueError)
    return caught.value


# -- token ids ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "eos, match",
    [
        (2.0, "eos_token_id must be a token id or a list of token ids, got float 2.0"),
        (True, "eos_token_id must be a token id or a list of token ids, got bool True"),
        (np.bool_(True), "eos_token_id must be a token id"),
        (-1, r"eos_token_id holds token id -1, outside the model's vocabulary \[0, 384\)"),
        (VOCAB, r"eos_token_id holds token id 384, outside the model's vocabulary"),
        ([3, 10**6], r"eos_token_id holds token id 1000000, outside"),
        ([3, 2.5], "eos_token_id must hold integer token ids, found float 2.5"),
        ([3, False], "eos_token_id must hold integer token ids, found bool False"),
        (torch.tensor([1.0]), "eos_token_id must hold integer token ids"),
        (torch.tensor(3.0), "eos_token_id must be a token id or a list of token ids, got a torch.float32 tensor"),
        ("<|im_end|>", r"convert tokens with tokenizer.convert_tokens_to_ids\('<\|im_end\|>'\)"),
        (object(), "eos_token_id must be a token id or a list of token ids, got object"),
    ],
    ids=repr,
)
def test_bad_eos_token_id(model, eos, match):
    refused(model, match, PROMPT, NEW_TOKENS, eos_token_id=eos)


@pytest.fixture(scope="module")
def eos_case(model, expected):
    """(an eos id that occurs among the greedy tokens, the output cut there): the case EOS must stop."""
    new = expected[0, PROMPT.shape[1] :]
    eos = int(new[2])
    cut = int((new == eos).nonzero()[0]) + 1
    return eos, expected[:, : PROMPT.shape[1] + cut]


@pytest.mark.parametrize(
    "form",
    [
        int,
        np.int64,
        np.int32,
        torch.tensor,
        lambda i: np.array([i]),
        lambda i: torch.tensor([i]),
        lambda i: [np.int64(i)],
        lambda i: (i,),
    ],
)
def test_eos_token_id_in_any_integer_form_stops_like_an_int(model, eos_case, form):
    eos, stopped = eos_case
    assert stopped.shape[1] < PROMPT.shape[1] + NEW_TOKENS  # precondition: the EOS does cut the output
    assert torch.equal(generate(model, PROMPT, NEW_TOKENS, eos_token_id=form(eos)).sequences, stopped)


@pytest.mark.parametrize(
    "prompt, match",
    [
        (torch.tensor([[1, VOCAB]]), r"prompt holds token id 384, outside the model's vocabulary \[0, 384\)"),
        (torch.tensor([[1, -2]]), "prompt holds token id -2"),
        ([[1.5, 2.0]], "input_ids must hold integer token ids, got dtype torch.float"),
        ([[True, False]], "input_ids must hold integer token ids, got dtype torch.bool"),
        ([[1, 2], [3]], r"input_ids rows have different lengths \[1, 2\]: pad them on the left"),
        (b"abc", "input_ids must be token ids, got text"),
        (3, "input_ids must be token ids .* got int"),
        (np.array([["a", "b"]]), "input_ids must be a rectangular array of integer token ids"),
    ],
    ids=repr,
)
def test_bad_prompt(model, prompt, match):
    refused(model, match, prompt, NEW_TOKENS)


# -- counts and probabilities --------------------------------------------------------------------
@pytest.mark.parametrize("name", ["max_new_tokens", "lookup_tokens", "datastore_tokens"])
@pytest.mark.parametrize(
    "value, shown",
    [(2.5, "float 2.5"), (True, "bool True"), (-3, "int -3"), ("4", "str '4'"), (np.float64(3.0), "float64 3.0")],
)
def test_bad_counts_say_what_they_got(model, name, value, shown):
    kwargs = {"max_new_tokens": NEW_TOKENS, name: value}
    error = refused(model, f"{name} must be an integer >= 0", PROMPT, **kwargs)
    assert shown in str(error)


@pytest.mark.parametrize("form", [np.int64, np.int16, torch.tensor, np.array])
def test_counts_as_numpy_or_tensor_scalars_give_the_same_tokens(model, expected, form):
    out = generate(model, PROMPT, form(NEW_TOKENS), lookup_tokens=form(2), datastore_tokens=form(0)).sequences
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=True), "temperature must be a finite number >= 0 .* got bool True"),
        (dict(temperature="0.7"), "temperature must be a finite number >= 0 .* got str '0.7'"),
        (dict(temperature=torch.tensor([0.5, 0.5])), "temperature must be a finite number"),
        (dict(temperature=1e400), "temperature must be a finite number"),
        (dict(temperature=10**400), "temperature must be a finite number"),
        (dict(temperature=1.0, top_k=np.float32(3)), "top_k must be a positive integer or None, got float32 3.0"),
        (dict(temperature=1.0, top_k=True), "top_k must be a positive integer or None, got bool True"),
        (dict(temperature=1.0, top_p=True), r"top_p must be in \(0, 1\] or None, got bool True"),
        (dict(temperature=1.0, top_p=np.float64(1.5)), r"top_p must be in \(0, 1\] or None, got float64 1.5"),
        (dict(temperature=1.0, top_p="high"), r"top_p must be in \(0, 1\]"),
    ],
    ids=repr,
)
def test_bad_sampling_numbers(model, kwargs, match):
    refused(model, match, PROMPT, NEW_TOKENS, **kwargs)


def test_numpy_sampling_settings_sample_like_python_numbers(model):
    python = generate(
        model, PROMPT, NEW_TOKENS, temperature=0.8, top_k=20, top_p=0.9, generator=torch.Generator().manual_seed(4)
    )
    numpy = generate(
        model,
        PROMPT,
        np.int64(NEW_TOKENS),
        temperature=np.float64(0.8),
        top_k=np.int32(20),
        top_p=torch.tensor(0.9, dtype=torch.float64),
        generator=torch.Generator().manual_seed(4),
    )
    assert torch.equal(python.sequences, numpy.sequences)


@pytest.mark.parametrize("temperature", [1e-45, 1e-46, 1e-300, 5e-324, np.float32(1e-45)])
def test_near_zero_temperature_samples_the_argmax(model, expected, temperature):
    """As the temperature goes to 0 the target's distribution goes to its argmax (no overflow to inf)."""
    generator = torch.Generator().manual_seed(0)
    out = generate(model, PROMPT, NEW_TOKENS, temperature=temperature, generator=generator).sequences
    assert torch.equal(out, expected)
    assert torch.equal(out, plain_greedy(model.base_model, PROMPT, NEW_TOKENS))


# -- generator and streamer --------------------------------------------------------------------
@pytest.mark.parametrize(
    "generator, match",
    [
        (0, "generator must be a torch.Generator .* got int"),
        (np.random.default_rng(0), "generator must be a torch.Generator .* got Generator"),
        ("cpu", "generator must be a torch.Generator"),
    ],
)
def test_bad_generator(model, generator, match):
    refused(model, match, PROMPT, NEW_TOKENS, temperature=1.0, generator=generator)


def test_generator_on_another_device_is_refused_up_front():
    with pytest.raises(GenerationInputError, match=r"generator is on cpu but the model is on cuda:0; create it there"):
        check_generator(torch.Generator(), torch.device("cuda:0"))


class PutOnly:
    def put(self, tokens):
        pass


class Recorder:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, tokens):
        self.chunks.append(tokens.flatten().tolist())

    def end(self):
        self.ended = True


@pytest.mark.parametrize(
    "streamer, match",
    [
        (PutOnly(), "streamer must have put.* and end.* PutOnly lacks end"),
        (print, "streamer must have put.* builtin_function_or_method lacks put and end"),
        ([], "lacks put and end"),
    ],
)
def test_bad_streamer_is_refused_before_decoding(model, streamer, match):
    calls = []
    handle = model.base_model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        refused(model, match, PROMPT, NEW_TOKENS, streamer=streamer)
    finally:
        handle.remove()
    assert calls == []


def test_a_streamer_gets_the_prompt_then_every_token(model, expected):
    streamer = Recorder()
    generate(model, PROMPT, NEW_TOKENS, streamer=streamer)
    assert streamer.ended and sum(streamer.chunks, []) == expected[0].tolist()


# -- what tokenizers return --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def chat(tokenizer):
    """transformers 5: apply_chat_template(..., return_tensors="pt") returns a BatchEncoding (the README's call)."""
    encoding = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Why is the sky blue?"}], add_generation_prompt=True, return_tensors="pt"
    )
    assert not isinstance(encoding, torch.Tensor) and "attention_mask" in encoding  # the case this section is for
    return encoding


def test_batch_encoding_as_input_ids(model, chat):
    assert torch.equal(
        generate(model, chat, NEW_TOKENS).sequences, generate(model, chat["input_ids"], NEW_TOKENS).sequences
    )


def test_batch_encoding_unpacked_like_model_generate(model, chat):
    out = generate(model, **chat, max_new_tokens=NEW_TOKENS).sequences
    assert torch.equal(out, plain_greedy(model.base_model, chat["input_ids"], NEW_TOKENS))


@pytest.mark.parametrize(
    "form",
    [dict, lambda e: e["input_ids"].numpy(), lambda e: e["input_ids"].tolist(), lambda e: e["input_ids"][0].tolist()],
)
def test_other_forms_of_the_prompt(model, chat, form):
    assert torch.equal(
        generate(model, form(chat), NEW_TOKENS).sequences, generate(model, chat["input_ids"], NEW_TOKENS).sequences
    )


def test_unbatched_tokenizer_output_with_lists(model, tokenizer):
    encoding = tokenizer("What is the capital city of France?")
    assert isinstance(encoding["input_ids"], list)  # precondition: no return_tensors
    out = generate(model, encoding, NEW_TOKENS).sequences
    assert out[0, : len(encoding["input_ids"])].tolist() == encoding["input_ids"]


@pytest.mark.parametrize(
    "case, match",
    [
        ("right-padded", r"attention_mask row\(s\) \[0\] have padding after their first token"),
        ("wrong shape", r"attention_mask has shape \(1, 3\) but input_ids has shape \(1, 4\)"),
        ("not 0/1", "attention_mask must hold only 1"),
        ("float", "attention_mask must hold integer token ids"),
        ("twice", "attention_mask is given twice"),
        ("no ids", r"input_ids is a mapping without an 'input_ids' entry \(keys \['attention_mask'\]\)"),
    ],
)
def test_bad_attention_mask_or_encoding(model, case, match):
    ones = torch.ones_like(PROMPT)
    arguments = {
        "right-padded": ((PROMPT,), dict(attention_mask=torch.tensor([[1, 1, 0, 0]]))),
        "wrong shape": ((PROMPT,), dict(attention_mask=ones[:, :3])),
        "not 0/1": ((PROMPT,), dict(attention_mask=2 * ones)),
        "float": ((PROMPT,), dict(attention_mask=ones.float())),
        "twice": (({"input_ids": PROMPT, "attention_mask": ones},), dict(attention_mask=ones)),
        "no ids": (({"attention_mask": ones},), {}),
    }
    args, kwargs = arguments[case]
    refused(model, match, *args, NEW_TOKENS, **kwargs)


# -- the model ---------------------------------------------------------------------------------
def test_not_a_medusa_model():
    base = tiny_base_model("llama", vocab_size=VOCAB)
    with pytest.raises(GenerationInputError, match="model must be a medusa_lite.MedusaModel .* got LlamaForCausalLM"):
        generate(base, PROMPT, NEW_TOKENS)


def test_meta_device_model_gets_a_clear_error():
    with torch.device("meta"):
        base = tiny_base_model("llama", vocab_size=VOCAB)
        model = MedusaModel(base, random_heads(base, num_heads=2))
    assert model.device.type == "meta"  # precondition
    with pytest.raises(GenerationInputError, match="weights are on the meta device .* never loaded"):
        generate(model, PROMPT, NEW_TOKENS)


@pytest.fixture(scope="module")
def dropout_model():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=5, logit_scale=4.0, attention_dropout=0.5)
    return MedusaModel(base, random_heads(base, num_heads=2))


def test_greedy_is_deterministic_in_train_mode_and_the_mode_is_restored(dropout_model):
    model = dropout_model
    reference = plain_greedy(model.base_model.eval(), PROMPT, NEW_TOKENS)
    model.train()
    model.heads.eval()  # a mixed state, restored exactly
    with torch.no_grad():
        noisy = [model.base_model(PROMPT).logits for _ in range(2)]
    assert not torch.equal(*noisy)  # precondition: in train mode the target is not deterministic
    for _ in range(3):
        assert torch.equal(generate(model, PROMPT, NEW_TOKENS).sequences, reference)
    assert model.training and model.base_model.training and not model.heads.training
    model.eval()


def test_eval_mode_is_restored_after_an_error(dropout_model):
    model = dropout_model.train()
    with pytest.raises(GenerationInputError):
        generate(model, PROMPT, -1)
    assert model.training and all(m.training for m in model.modules())
    model.eval()


# -- the tree ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tree",
    [
        np.array([[0], [1]]),
        [[np.int64(0)], [np.int32(1)]],
        [torch.tensor([0]), torch.tensor([1])],
        [[torch.tensor(0)], [1]],
    ],
    ids=["array", "numpy ranks", "tensor rows", "0-d tensor rank"],
)
def test_tree_paths_with_numpy_or_tensor_ranks(model, tree):
    assert torch.equal(
        generate(model, PROMPT, NEW_TOKENS, tree=tree).sequences,
        generate(model, PROMPT, NEW_TOKENS, tree=[[0], [1]]).sequences,
    )


@pytest.mark.parametrize(
    "tree, match",
    [
        (torch.tensor(3), "a tree is a list of paths of top-k ranks, got a torch.int64 tensor"),
        (5, "a tree is a list of paths of top-k ranks, got int 5"),
        ([[0], [True]], r"tree path \(True,\) holds True: ranks must be integers >= 0"),
        ([[0], [1.0]], r"holds 1.0: ranks must be integers"),
    ],
    ids=repr,
)
def test_bad_tree_argument(model, tree, match):
    with pytest.raises(MedusaError, match=match) as caught:
        generate(model, PROMPT, NEW_TOKENS, tree=tree)
    assert isinstance(caught.value, ValueError)
