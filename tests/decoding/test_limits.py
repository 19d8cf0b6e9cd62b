"""Length limits and EOS: stop exactly where plain decoding stops, never index out of range."""

import pytest
import torch
from tiny_models import OracleMedusaModel, plain_greedy, random_heads, tiny_base_model

from medusa_lite import GenerationInputError, MedusaModel, generate
from medusa_lite.decoding.generate import DEFAULT_LOOKUP_TOKENS

MAX_POSITIONS = 40
LONG_RUN_TOKENS = 2000


def test_context_overflow_raises_before_starting():
    base = tiny_base_model("llama", vocab_size=64, max_position_embeddings=MAX_POSITIONS)
    model = MedusaModel(base, random_heads(base, 3))
    with pytest.raises(
        GenerationInputError,
        match=r"prompt of 30 tokens \+ max_new_tokens=20 exceeds the model's context of 40 positions.*at most 10",
    ):
        generate(model, torch.ones(1, 30, dtype=torch.long), 20)


def test_generation_up_to_the_last_position_is_exact():
    """Prompt + new tokens == max positions: the tree is pruned so no node passes the limit."""
    base = tiny_base_model("llama", vocab_size=64, max_position_embeddings=MAX_POSITIONS, seed=2)
    prompt = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(3))
    expected = plain_greedy(base, prompt, MAX_POSITIONS - 10)
    oracle = OracleMedusaModel(base, random_heads(base, 4), expected[0])
    positions = []
    handle = base.register_forward_pre_hook(
        lambda m, a, kw: (
            positions.append(int(kw["position_ids"].max())) if kw.get("position_ids") is not None else None
        ),
        with_kwargs=True,
    )
    try:
        out = generate(oracle, prompt, MAX_POSITIONS - 10, tree=[(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)])
    finally:
        handle.remove()
    assert torch.equal(out.sequences, expected)
    assert max(positions) < MAX_POSITIONS


def test_a_sliding_window_is_no_context_limit():
    """Past the window is decoded (exactly: tests/decoding/test_sliding_window.py); max positions still bound it."""
    base = tiny_base_model("mistral", vocab_size=64, sliding_window=16)
    model = MedusaModel(base, random_heads(base, 2))
    assert generate(model, torch.ones(1, 10, dtype=torch.long), 10).stats.new_tokens == 10
    with pytest.raises(GenerationInputError, match="context of 256 positions"):
        generate(model, torch.ones(1, 250, dtype=torch.long), 10)


EOS_CASES = ["inside-path", "at-root", "bonus"]
EOS_TREE = [(0,), (0, 0), (0, 0, 0)]
FULL_STEP = len(EOS_TREE) + 1  # with oracle heads every step accepts 3 guesses + the bonus


def first_occurrences(tokens: torch.Tensor) -> list[int]:
    """Indices i whose token does not occur before i (where decoding would stop were it EOS)."""
    return [i for i in range(tokens.numel()) if not bool((tokens[:i] == tokens[i]).any())]


def role_in_oracle_run(index: int) -> str:
    """What new token ``index`` is in an oracle run on EOS_TREE: the prefill's token, an accepted guess or a bonus.

    New token 0 comes from the prefill; step s (from 1) commits tokens FULL_STEP (s - 1) + 1 ..
    FULL_STEP s, the last of them its bonus.
    """
    if index == 0:
        return "at-root"
    return "bonus" if index % FULL_STEP == 0 else "inside-path"


@pytest.mark.parametrize("where", EOS_CASES)
def test_eos_anywhere_ends_generation_exactly_there(where):
    """Find the plain greedy output, declare one of its tokens EOS, and check both stop at it."""
    base = tiny_base_model("llama", vocab_size=64, seed=5)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    reference = plain_greedy(base, prompt, 30, eos_token_id=[])[0]
    new = reference[prompt.shape[1] :]
    # The first token, by position, whose first occurrence has the role asked for: decoding stops there.
    index = next((i for i in first_occurrences(new) if role_in_oracle_run(i) == where), None)
    assert index is not None, f"no token of the reference is first seen at a {where} position: pick another seed"
    eos = int(new[index])
    expected = plain_greedy(base, prompt, 30, eos_token_id=eos)
    assert expected.shape[1] == prompt.shape[1] + index + 1
    oracle = OracleMedusaModel(base, random_heads(base, 3), reference)
    out = generate(oracle, prompt, 30, tree=EOS_TREE, eos_token_id=eos, lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, expected)
    assert out.sequences[0, -1] == eos
    # The run reached the case: EOS came from the prefill, from inside an accepted path, or as a step's bonus.
    assert out.stats.tokens_per_step == [FULL_STEP] * out.stats.steps, "the oracle heads should accept every guess"
    assert out.stats.steps == -(-index // FULL_STEP)
    if where == "bonus":
        assert index == FULL_STEP * out.stats.steps, "EOS should be the last step's bonus token"
    elif where == "inside-path":
        assert 0 < FULL_STEP * out.stats.steps - index < FULL_STEP, "EOS should be an accepted guess of the last step"
    else:
        assert out.stats.steps == 0


def test_any_of_several_eos_ids_stops():
    """Two EOS ids, listed latest-first: generation stops at the first of either, after verification steps."""
    base = tiny_base_model("qwen2", vocab_size=64, seed=6)
    model = MedusaModel(base, random_heads(base, 3))
    prompt = torch.tensor([[7, 7, 2]])
    reference = plain_greedy(base, prompt, 30, eos_token_id=[])[0, 3:]
    later, earlier = [i for i in first_occurrences(reference) if i >= 2][-2:][::-1]
    assert earlier < later, "need two ids first seen after the first verification step"
    eos = [int(reference[later]), int(reference[earlier])]
    expected = plain_greedy(base, prompt, 30, eos_token_id=eos)
    assert expected.shape[1] == 3 + earlier + 1 and expected[0, -1] == eos[1]
    out = generate(model, prompt, 30, eos_token_id=eos)
    assert torch.equal(out.sequences, expected)
    assert out.stats.steps >= 1, "the run stopped before any verification step"


def test_long_generation_keeps_cache_bounded_by_committed_tokens():
    """Two thousand tokens: the cache never holds rejected tree nodes and memory stays bounded."""
    base = tiny_base_model("llama", vocab_size=64, seed=8, max_position_embeddings=4096)
    model = MedusaModel(base, random_heads(base, 3))
    captured = {}

    def grab(module, args, kwargs, output):
        cache = kwargs["cache"]
        captured.setdefault("max_storage", 0)
        captured["cache"] = cache
        captured["max_storage"] = max(
            captured["max_storage"], sum(layer.keys.untyped_storage().nbytes() for layer in cache.layers)
        )

    handle = base.register_forward_hook(grab, with_kwargs=True)
    try:
        out = generate(model, torch.tensor([[1, 2, 3]]), LONG_RUN_TOKENS, eos_token_id=[])
    finally:
        handle.remove()
    length = out.sequences.shape[1]
    assert length == 3 + LONG_RUN_TOKENS
    cache = captured["cache"]
    assert cache.get_seq_length() == length - 1
    layer = cache.layers[0]
    bytes_per_position = layer.keys.shape[1] * layer.keys.shape[-1] * layer.keys.element_size()
    # Storage is reserved once for the prompt, the new tokens and the widest step (tree + lookup chain), never more.
    assert captured["max_storage"] <= len(cache.layers) * bytes_per_position * (
        length + out.stats.tree_nodes + DEFAULT_LOOKUP_TOKENS
    )
