"""Greedy medusa-lite output is token-identical to the plain target's greedy generate."""

import pytest
import torch
from tiny_models import FAMILIES, OracleMedusaModel, PartlyRightOracle, plain_greedy, random_heads, tiny_base_model

from medusa_lite import MedusaModel, Tree, default_tree, generate

TREES = {
    "default": None,
    "chain": [(0,), (0, 0), (0, 0, 0)],
    "wide": [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)],
    "root-only": [],  # with the lookup off: one row per step, plain decoding through the tree path
    "lookup-only": [],  # the root + a prompt-lookup chain, no head guesses
}
NUM_PROMPTS = 8
MAX_NEW_TOKENS = 40
# Random-init seeds per family: mistral without a sliding window is llama's architecture, so the
# same seed would make its case a copy of llama's (checked in test_random_heads_match_plain_greedy).
FAMILY_SEEDS = {"llama": 3, "qwen2": 3, "mistral": 4}


def family_base(family: str, **kwargs):
    return tiny_base_model(family, vocab_size=96, seed=FAMILY_SEEDS[family], **kwargs)


def lookup_arguments(tree_name: str) -> dict:
    """root-only: no prompt lookup and no datastore; otherwise generate's defaults."""
    return dict(lookup_tokens=0, datastore=False) if tree_name == "root-only" else {}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tree_name", list(TREES))
def test_random_heads_match_plain_greedy(family, tree_name):
    """Random heads (guesses rejected) and partly-right oracle heads alone (accepted or not) match plain greedy."""
    base = family_base(family)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    generator = torch.Generator().manual_seed(5)
    random_stats, oracle_stats = [], []
    for index in range(NUM_PROMPTS):
        prompt = torch.randint(0, 96, (1, int(torch.randint(1, 20, (1,), generator=generator))), generator=generator)
        expected = plain_greedy(base, prompt, MAX_NEW_TOKENS)
        if index == 0 and family != "llama":  # a family's case is its own model, not llama's again
            llama = plain_greedy(family_base("llama"), prompt, MAX_NEW_TOKENS)
            assert not torch.equal(expected, llama), f"{family} reproduces llama"
        out = generate(model, prompt, MAX_NEW_TOKENS, tree=TREES[tree_name], **lookup_arguments(tree_name))
        assert torch.equal(out.sequences, expected), f"{family}/{tree_name}: diverged from plain greedy"
        assert out.stats.new_tokens == MAX_NEW_TOKENS
        random_stats.append(out.stats)
        if tree_name == "root-only":
            assert out.stats.steps == MAX_NEW_TOKENS - 1, "root-only accepted a guess"
            assert out.stats.mean_verified_rows == 1.0, "root-only verified more than the root"
        if TREES[tree_name] != []:  # heads alone, right some of the time
            oracle = PartlyRightOracle(base, random_heads(base, num_heads=3, seed=4), expected[0], seed=index)
            oracle_out = generate(
                oracle, prompt, MAX_NEW_TOKENS, tree=TREES[tree_name], lookup_tokens=0, datastore=False
            )
            assert torch.equal(oracle_out.sequences, expected), f"{family}/{tree_name}: partly-right heads diverged"
            oracle_stats.append(oracle_out.stats)
    if TREES[tree_name] != []:
        per_step = [tokens for stats in oracle_stats for tokens in stats.tokens_per_step]
        depth = max(stats.tree_depth for stats in oracle_stats)
        # Heads-only runs took the accept path at every depth and the reject path too.
        accepted = [sum(stats.accepted_at_depth[d] for stats in oracle_stats) for d in range(depth)]
        assert min(accepted) > 0, f"a depth never accepted a guess (steps accepting at each depth: {accepted})"
        assert min(per_step) == 1, "no step rejected every guess"
    if tree_name == "lookup-only":
        assert sum(stats.lookup_steps for stats in random_stats) > 0, "the lookup chain was never accepted"


@pytest.mark.parametrize("family", FAMILIES)
def test_oracle_heads_accept_full_depth_every_step(family):
    base = family_base(family)
    heads = random_heads(base, num_heads=4)
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(8))
    expected = plain_greedy(base, prompt, MAX_NEW_TOKENS)
    oracle = OracleMedusaModel(base, heads, expected[0])
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0), (2,)])
    out = generate(oracle, prompt, MAX_NEW_TOKENS, tree=tree, lookup_tokens=0)
    assert torch.equal(out.sequences, expected)
    full_step = tree.depth + 1
    # Every step accepts the whole depth + the bonus token, except the last, which the
    # max_new_tokens limit may shorten (prefill gives the first token).
    assert out.stats.tokens_per_step[:-1] == [full_step] * (out.stats.steps - 1)
    assert out.stats.steps == -(-(MAX_NEW_TOKENS - 1) // full_step)
    assert out.stats.mean_accepted_tokens == pytest.approx(MAX_NEW_TOKENS / (out.stats.steps + 1))
    assert out.stats.mean_tokens_per_step == pytest.approx(
        (MAX_NEW_TOKENS - 1) / out.stats.steps
    )  # Spec-Bench's count
    assert out.stats.accepted_at_depth[tree.depth - 1] >= out.stats.steps - 1


def test_target_called_once_per_step_and_cache_holds_committed_tokens():
    """One target forward per decoding step (+ the prefill), and before every verification the
    KV cache holds exactly the committed tokens except the newest one (the tree's root, which
    that very forward processes)."""
    base = tiny_base_model("llama", vocab_size=64, seed=11)
    prompt = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(12))
    reference = plain_greedy(base, prompt, 30)
    oracle = OracleMedusaModel(base, random_heads(base, num_heads=3), reference[0])
    committed = []

    class Recorder:
        def put(self, value):
            committed.append(value.numel())

        def end(self):
            pass

    cache_lengths = []
    handle = base.register_forward_pre_hook(
        lambda mod, args, kwargs: cache_lengths.append(kwargs["cache"].get_seq_length()), with_kwargs=True
    )
    try:
        out = generate(oracle, prompt, 30, tree=[(0,), (0, 0), (1,)], streamer=Recorder())
    finally:
        handle.remove()
    assert torch.equal(out.sequences, reference)
    assert len(cache_lengths) == out.stats.steps + 1 == out.stats.target_calls
    assert out.stats.steps < 29, "oracle heads should need fewer steps than tokens"
    # committed[0] is the prompt, committed[1] the prefill's token, then one entry per step.
    assert cache_lengths[0] == 0
    totals = torch.tensor(committed).cumsum(0).tolist()
    assert cache_lengths[1:] == [total - 1 for total in totals[1:-1]]


def test_cache_length_after_generation_equals_committed_minus_root():
    base = tiny_base_model("qwen2", vocab_size=64, seed=13)
    model = MedusaModel(base, random_heads(base, num_heads=2))
    captured = {}

    def grab(mod, args, kwargs, output):
        captured["cache"] = kwargs["cache"]

    handle = base.register_forward_hook(grab, with_kwargs=True)
    try:
        out = generate(model, torch.tensor([[1, 2, 3]]), 17)
    finally:
        handle.remove()
    # After the last verification the cache holds prefix + accepted path (the last bonus is pending).
    assert captured["cache"].get_seq_length() == out.sequences.shape[1] - 1


def test_eager_attention_also_exact():
    base = tiny_base_model("llama", vocab_size=80, seed=21, attn_implementation="eager")
    model = MedusaModel(base, random_heads(base, num_heads=3))
    prompt = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(generate(model, prompt, 25, tree=default_tree(3)).sequences, plain_greedy(base, prompt, 25))


def test_own_lm_head_heads_are_exact():
    base = tiny_base_model("mistral", vocab_size=80, seed=22)
    model = MedusaModel(base, random_heads(base, num_heads=2, use_base_lm_head=False, num_layers=2))
    prompt = torch.tensor([[1, 9, 4]])
    assert torch.equal(generate(model, prompt, 25).sequences, plain_greedy(base, prompt, 25))


def test_input_on_1d_and_2d_give_same_result():
    base = tiny_base_model("llama", vocab_size=64, seed=30)
    model = MedusaModel(base, random_heads(base, num_heads=2))
    a = generate(model, torch.tensor([3, 4, 5]), 10).sequences
    b = generate(model, torch.tensor([[3, 4, 5]]), 10).sequences
    assert torch.equal(a, b)
