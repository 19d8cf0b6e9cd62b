"""Lookahead decoding as a proposer: exact (greedy identical, sampling chi-square), its pool fills and
pays on repetitive text, and its Jacobi rows neither reach the verification rows nor stay in the cache.

The chi-square tests compare the first tokens sampled with lookahead guesses against the target's
exact distribution (tests/distribution_check.py, its ALPHA, at the sample size whose power
test_proposers.py's negative control shows on the same kind of model). A leak of the lookahead rows
into verification is NOT what they catch (letting the draft rows attend to them still gave p=0.39
at 3000 samples): the logits test below catches it exactly, and shows so with the leaky mask.
"""

import pytest
import torch
from distribution_check import ALPHA, chi_square_p_value, exact_distribution, sampled_counts, sampled_outputs
from tiny_models import FAMILIES, plain_greedy, tiny_base_model

import medusa_lite.decoding.verify
from medusa_lite import GenerationInputError, LookaheadProposer, MedusaModel, SamplingSettings, SideRows, generate
from medusa_lite.decoding.cache import reserved_cache
from medusa_lite.decoding.verify import keep_accepted_in_cache, verify_tree, verify_with_side_rows
from medusa_lite.decoding.windows import additive
from medusa_lite.proposers.lookahead import (
    LOOKAHEAD_SOURCE,
    trie_candidates,
    updated_pool,
    window_ngrams,
    window_rows,
)
from medusa_lite.trees.draft import chain_draft


# -- the pure pieces -----------------------------------------------------------------------------
def test_window_rows_follow_each_columns_trajectory():
    rows = window_rows([[10, 11, 12], [20, 21, 22]], torch.device("cpu"))
    assert rows.tokens.tolist() == [10, 11, 12, 20, 21, 22]
    assert rows.offsets.tolist() == [1, 2, 3, 2, 3, 4]  # column + level + 1 after the root
    # Level 1, column 2 sees level 0's columns 0..2 and itself: positions 1, 2, 3, then 4.
    assert rows.mask[5].tolist() == [True, True, True, False, False, True]
    assert rows.mask[1].tolist() == [True, True, False, False, False, False]  # level 0 is causal


def test_full_window_gives_one_ngram_per_column_and_the_pool_keeps_the_newest():
    ngrams = window_ngrams([[1, 2], [3, 4]], [5, 6])
    assert ngrams == [(1, 3, 5), (2, 4, 6)]
    pool = updated_pool({}, ngrams, per_key=2)
    pool = updated_pool(pool, [(1, 7, 8), (1, 3, 5), (1, 9, 9)], per_key=2)
    assert pool[1] == ((9, 9), (3, 5))  # newest first, duplicates moved up, at most 2
    assert pool[2] == ((4, 6),)


def test_candidates_merge_into_a_trie_within_budget():
    candidates = trie_candidates([(5, 6, 7), (5, 8, 9), (4, 4, 4)], max_depth=2, max_nodes=4)
    assert candidates.tokens.tolist() == [5, 6, 8, 4]
    assert list(candidates.parents) == [0, 1, 1, 0]
    assert trie_candidates([], max_depth=3, max_nodes=4) is None


@pytest.mark.parametrize("argument", ["window", "ngram_size", "candidates"])
def test_bad_settings_are_named(argument):
    with pytest.raises(GenerationInputError, match=argument):
        LookaheadProposer(**{argument: 0})


# -- exactness -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_is_identical_to_plain_greedy(family):
    base = tiny_base_model(family, vocab_size=8, seed=3, logit_scale=3.0)
    model = MedusaModel(base, None)
    accepted = 0
    for seed in range(3):
        prompt = torch.randint(0, 8, (1, 6), generator=torch.Generator().manual_seed(seed))
        out = generate(model, prompt, 40, proposers=[LookaheadProposer(window=4, ngram_size=3, candidates=3)])
        assert torch.equal(out.sequences, plain_greedy(base, prompt, 40))
        accepted += out.stats.accepted_by_source.get(LOOKAHEAD_SOURCE, 0)
    assert accepted > 0, "no lookahead guess was accepted: the test did not reach its case"


VOCAB = 3
NEW_TOKENS = 4
NUM_SAMPLES = 3000
PROMPT = torch.tensor([[0, 2, 1, 0, 2]])
SMALL_WINDOW = dict(window=3, ngram_size=2, candidates=2)  # n-grams from the first step on, within 4 tokens


@pytest.fixture(scope="module")
def model():
    return MedusaModel(tiny_base_model("llama", vocab_size=VOCAB, seed=42, logit_scale=5.0), None)


SAMPLING_CASES = {
    "T1.0": SamplingSettings(1.0),
    "T0.7-topk2": SamplingSettings(0.7, top_k=2),
    "T1.0-topp0.8": SamplingSettings(1.0, top_p=0.8),
}


def accepted_lookahead_guesses(model, settings, runs=50):
    outputs = sampled_outputs(
        model, PROMPT, NEW_TOKENS, settings, runs, seed=7, proposers=[LookaheadProposer(**SMALL_WINDOW)]
    )
    return sum(out.stats.accepted_by_source.get(LOOKAHEAD_SOURCE, 0) for out in outputs)


@pytest.mark.parametrize("case", list(SAMPLING_CASES))
def test_sampling_keeps_the_target_distribution(model, case):
    settings = SAMPLING_CASES[case]
    assert accepted_lookahead_guesses(model, settings) > 0, "no lookahead guess accepted: the case is not reached"
    exact = exact_distribution(model.base_model, PROMPT, NEW_TOKENS, settings)
    counts = sampled_counts(
        model, PROMPT, NEW_TOKENS, settings, NUM_SAMPLES, seed=1, proposers=[LookaheadProposer(**SMALL_WINDOW)]
    )
    p_value = chi_square_p_value(counts, exact, NUM_SAMPLES)
    assert p_value > ALPHA, f"samples differ from the target's distribution (p={p_value:.2e})"


# -- the pool fills and pays; the rows stay out of the cache --------------------------------------
def test_pool_fills_and_its_guesses_are_accepted_on_repetitive_text(monkeypatch):
    base = tiny_base_model("llama", vocab_size=16, seed=5, logit_scale=3.0)
    model = MedusaModel(base, None)
    prompt = torch.tensor([[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]])
    expected = plain_greedy(base, prompt, 60)[0, prompt.shape[1] :]
    trigrams = [tuple(expected[i : i + 3].tolist()) for i in range(expected.numel() - 2)]
    repeated = sum(trigram in trigrams[:i] for i, trigram in enumerate(trigrams))
    assert repeated >= len(trigrams) // 2, f"precondition: the greedy continuation repeats itself ({repeated} repeats)"
    runs = []
    begin = LookaheadProposer.begin
    monkeypatch.setattr(LookaheadProposer, "begin", lambda self, *args: runs.append(begin(self, *args)) or runs[-1])
    out = generate(model, prompt, 60, proposers=[LookaheadProposer()])
    assert torch.equal(out.sequences[0, prompt.shape[1] :], expected)
    (run,) = runs
    assert sum(len(continuations) for continuations in run.pool.values()) >= 10, "the pool did not fill"
    accepted = out.stats.accepted_by_source.get(LOOKAHEAD_SOURCE, 0)
    assert accepted >= 10 and out.stats.mean_tokens_per_step > 1.2, (accepted, out.stats.mean_tokens_per_step)


def test_lookahead_rows_change_no_draft_logit_and_leave_no_trace_in_the_cache():
    base = tiny_base_model("qwen2", vocab_size=32, seed=9)
    model = MedusaModel(base, None)
    prefix = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    draft = chain_draft(torch.tensor([5]), torch.tensor([3, 5, 8]), LOOKAHEAD_SOURCE)
    side = window_rows([[7, 7, 1], [2, 8, 1], [8, 2, 8]], torch.device("cpu"))
    assert isinstance(side, SideRows) and side.tokens.numel() == 9

    def prefilled():
        cache = reserved_cache(model, 64)
        model.target_forward(prefix, cache=cache, use_cache=True)
        return cache

    with torch.no_grad():
        alone_cache, with_side_cache = prefilled(), prefilled()
        alone = verify_tree(model, alone_cache, draft, draft.tokens)
        verified, side_logits = verify_with_side_rows(model, with_side_cache, draft, draft.tokens, side)
        assert side_logits.shape == (9, 32)
        torch.testing.assert_close(verified.logits, alone.logits, rtol=1e-5, atol=1e-5)
        leaky = medusa_lite.decoding.verify.side_rows_allowed(draft, side, prefix.shape[1])
        leaky[: draft.num_nodes, prefix.shape[1] + draft.num_nodes :] = True  # the control: draft rows see them
        leaky = additive(leaky, torch.float32, torch.device("cpu"))
        positions = torch.cat([draft.node_depths, side.offsets]) + prefix.shape[1]
        leaked = model.target_forward(
            torch.cat([draft.tokens, side.tokens])[None],
            position_ids=positions[None],
            attention_mask=leaky,
            cache=prefilled(),
            use_cache=True,
        )
        assert not torch.allclose(leaked.logits[0, : draft.num_nodes], alone.logits, rtol=1e-3, atol=1e-3)
        path = torch.tensor([0, 1, 2])
        keep_accepted_in_cache(with_side_cache, prefix.shape[1], path)
        reference = prefilled()
        model.target_forward(draft.tokens[path][None], cache=reference, use_cache=True)
    assert with_side_cache.get_seq_length() == prefix.shape[1] + 3
    for kept, plain in zip(with_side_cache.layers, reference.layers):
        torch.testing.assert_close(kept.keys, plain.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kept.values, plain.values, rtol=1e-5, atol=1e-5)
