"""Prompt lookup grafted onto the candidate tree: the chain search, the trie merge, exactness."""

import pytest
import torch
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import MedusaModel, Tree, generate
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.lookup import latest_match, prompt_lookup
from medusa_lite.trees.draft import draft_tree, graft_chain

FAMILIES = ("llama", "qwen2", "mistral")
MAX_NEW_TOKENS = 40


def ids(*tokens):
    return torch.tensor(tokens, dtype=torch.long)


def test_lookup_continues_the_latest_match_of_the_longest_ngram():
    history = ids(1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3)
    # "2 3" (n=2) beats the n=3 search (no earlier "5 2 3"); the latest "2 3" is followed by 7 8 5 ...
    assert prompt_lookup(history, 3).tolist() == [7, 8, 5]
    assert prompt_lookup(history, 1).tolist() == [7]
    assert prompt_lookup(ids(4, 5, 6, 4, 5), 4).tolist() == [6, 4, 5]  # the continuation may run into the tail


def test_lookup_prefers_longer_ngrams_and_returns_nothing_without_a_match():
    history = ids(1, 2, 4, 5, 3, 2, 6, 1, 2)
    assert prompt_lookup(history, 2).tolist() == [4, 5]  # "1 2" matched, not the later lone "2" -> 6
    assert prompt_lookup(ids(1, 2, 3), 4).numel() == 0
    assert prompt_lookup(ids(7), 4).numel() == 0
    assert prompt_lookup(history, 0).numel() == 0


def test_latest_match_names_the_matched_length_and_where_its_continuation_starts():
    assert latest_match(ids(1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3)) == (2, 7)  # the later "2 3", followed by 7 at index 7
    assert latest_match(ids(1, 2, 3, 4, 1, 2, 3)) == (3, 3)
    assert latest_match(ids(1, 2, 3)) == (0, None)


def test_a_short_match_is_trusted_for_fewer_tokens():
    history = ids(1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 6, 4, 2, 3)
    assert prompt_lookup(history, 8, tokens_per_matched_token=2).tolist() == [7, 8, 5, 6]  # "2 3": 2 x 2 tokens
    assert prompt_lookup(history, 3, tokens_per_matched_token=2).tolist() == [7, 8, 5]  # max_tokens still caps
    lone = ids(5, 6, 7, 8, 9, 5)
    assert prompt_lookup(lone, 8, tokens_per_matched_token=2).tolist() == [6, 7]  # one matched token: 2
    triple = ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3)
    assert prompt_lookup(triple, 8, tokens_per_matched_token=2).tolist() == [4, 5, 6, 7, 8, 9]


def test_graft_reuses_matching_nodes_and_adds_the_rest():
    tree = Tree.from_paths([(0,), (1,), (0, 0)])  # nodes: root, a=(0,), b=(1,), c=(0,0)
    draft = draft_tree(tree, ids(10, 11, 12, 13))
    merged = graft_chain(draft, ids(11, 13, 14, 15))  # follows a, c, then adds 14 -> 15
    assert merged.tokens.tolist() == [10, 11, 12, 13, 14, 15]
    assert merged.parents.tolist() == [0, 0, 0, 1, 3, 4]
    assert merged.node_depths.tolist() == [0, 1, 1, 2, 3, 4]
    assert merged.from_lookup.tolist() == [False, False, False, False, True, True]
    expected_mask = torch.zeros(6, 6, dtype=torch.bool)
    for node, ancestors in {0: [0], 1: [0, 1], 2: [0, 2], 3: [0, 1, 3], 4: [0, 1, 3, 4], 5: [0, 1, 3, 4, 5]}.items():
        expected_mask[node, ancestors] = True
    assert torch.equal(merged.ancestor_mask, expected_mask)


def test_graft_of_a_diverging_chain_makes_a_new_branch_and_keeps_siblings_distinct():
    tree = Tree.from_paths([(0,), (1,)])
    merged = graft_chain(draft_tree(tree, ids(10, 11, 12)), ids(20, 11))
    assert merged.tokens.tolist() == [10, 11, 12, 20, 11]
    assert merged.parents.tolist() == [0, 0, 0, 0, 3]
    for node in range(merged.num_nodes):
        children = [merged.tokens[j].item() for j in range(1, merged.num_nodes) if merged.parents[j] == node]
        assert len(children) == len(set(children))
    assert graft_chain(draft_tree(tree, ids(10, 11, 12)), ids(12)).num_nodes == 3  # fully merged: unchanged


def repetitive_prompt(generator, vocab):
    """A prompt that repeats a random phrase, so the lookup finds chains."""
    phrase = torch.randint(0, vocab, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator)
    return phrase.repeat(int(torch.randint(2, 4, (1,), generator=generator)))[None]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tree", [[], [(0,), (1,), (0, 0), (0, 0, 0)]], ids=["lookup-only", "tree+lookup"])
def test_greedy_with_lookup_is_identical_to_plain_greedy(family, tree):
    base = tiny_base_model(family, vocab_size=24, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4))
    generator = torch.Generator().manual_seed(5)
    lookup_steps = 0
    for _ in range(4):
        prompt = repetitive_prompt(generator, 24)
        out = generate(model, prompt, MAX_NEW_TOKENS, tree=tree, lookup_tokens=4)
        assert torch.equal(out.sequences, plain_greedy(base, prompt, MAX_NEW_TOKENS))
        assert out.stats.new_tokens == MAX_NEW_TOKENS
        lookup_steps += out.stats.lookup_steps
    assert lookup_steps > 0, "the test never exercised an accepted lookup guess"


def test_lookup_chain_never_passes_max_new_tokens():
    base = tiny_base_model("llama", vocab_size=24, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=2, seed=4))
    prompt = ids(1, 2, 3, 1, 2, 3, 1, 2, 3)[None]
    for max_new_tokens in (1, 2, 3, 7):
        out = generate(model, prompt, max_new_tokens, lookup_tokens=8)
        assert torch.equal(out.sequences, plain_greedy(base, prompt, max_new_tokens))


def test_bad_lookup_tokens_is_a_clear_error():
    base = tiny_base_model("llama", vocab_size=24, seed=3)
    model = MedusaModel(base, random_heads(base, num_heads=2, seed=4))
    for bad in (-1, 1.5, True):
        with pytest.raises(GenerationInputError, match="lookup_tokens"):
            generate(model, ids(1, 2)[None], 4, lookup_tokens=bad)
