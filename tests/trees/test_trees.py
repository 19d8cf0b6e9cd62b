"""Tree validation, shape tensors, optimal construction, and the degenerate trees."""

import pytest
import torch
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import MedusaModel, Tree, TreeError, best_tree, default_tree, generate
from medusa_lite.trees.tree import expected_accepted_tokens


@pytest.mark.parametrize(
    "paths, message",
    [
        ([(0,), (0,)], r"tree path \(0,\) appears twice"),
        ([(0,), (1, 0)], r"tree path \(1, 0\) has no parent: \(1,\) is missing"),
        ([(0,), (-1,)], r"holds -1: ranks must be integers >= 0"),
        ([(0,), ()], r"tree path \(\) is empty"),
        ([(0.5,)], r"holds 0.5"),
        (["01"], "is not a sequence of top-k ranks"),
        ("0,1", "got the string"),
        ([5], "is not a sequence"),
    ],
)
def test_malformed_trees_are_rejected(paths, message):
    with pytest.raises(TreeError, match=message):
        Tree.from_paths(paths)


@pytest.fixture(scope="module")
def model():
    base = tiny_base_model("llama", vocab_size=32, seed=3)
    return MedusaModel(base, random_heads(base, num_heads=2))


def test_tree_deeper_than_heads(model):
    with pytest.raises(TreeError, match="tree depth 3 exceeds the 2 Medusa heads"):
        generate(model, torch.tensor([[1, 2]]), 5, tree=[(0,), (0, 0), (0, 0, 0)])


def test_rank_beyond_vocabulary(model):
    with pytest.raises(TreeError, match="top-40 guesses but the heads guess among only 32 tokens"):
        generate(model, torch.tensor([[1, 2]]), 5, tree=[(39,)] + [(i,) for i in range(39)])


def test_empty_tree_is_plain_decoding_and_exact(model):
    prompt = torch.tensor([[4, 5, 6]])
    out = generate(model, prompt, 15, tree=[], lookup_tokens=0)
    assert torch.equal(out.sequences, plain_greedy(model.base_model, prompt, 15))
    assert out.stats.mean_accepted_tokens == 1.0 and out.stats.tokens_per_step == [1] * 14
    assert out.stats.mean_tokens_per_step == 1.0


def test_shape_tensors():
    tree = Tree.from_paths([(1,), (0,), (0, 0), (0, 1), (1, 0)])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0))
    assert tree.node_depths.tolist() == [0, 1, 1, 2, 2, 2]
    assert tree.parents.tolist() == [0, 0, 0, 1, 1, 2]
    assert tree.node_ranks.tolist() == [0, 0, 1, 0, 1, 0]
    assert tree.topk_per_depth() == [2, 2]
    mask = tree.ancestor_mask
    assert mask[5].tolist() == [True, False, True, False, False, True]
    assert mask[0].tolist() == [True, False, False, False, False, False]
    assert tree.pruned(1).paths == ((0,), (1,))


def test_tree_attention_mask_blocks_non_ancestors():
    from medusa_lite.decoding.verify import tree_attention_mask

    tree = Tree.from_paths([(0,), (1,), (0, 0)])
    mask = tree_attention_mask(tree, prefix_len=2, dtype=torch.float32, device=torch.device("cpu"))[0, 0]
    allowed = mask == 0
    assert allowed[:, :2].all()  # everyone sees the prefix
    assert allowed[3, 2:].tolist() == [True, True, False, True]  # (0,0) sees root, (0,), itself
    assert allowed[2, 2:].tolist() == [True, False, True, False]


def test_best_tree_is_optimal_for_small_cases():
    """Brute force over all trees of 4 guesses drawn from 2 heads x top-3."""
    import itertools

    accuracy = [[0.5, 0.2, 0.1], [0.4, 0.15, 0.05]]
    candidates = [(r,) for r in range(3)] + [(a, b) for a in range(3) for b in range(3)]
    best = 0.0
    for subset in itertools.combinations(candidates, 4):
        try:
            tree = Tree.from_paths(subset)
        except TreeError:
            continue
        best = max(best, expected_accepted_tokens(tree, accuracy))
    assert expected_accepted_tokens(best_tree(accuracy, 5), accuracy) == pytest.approx(best)


def test_default_tree_fits_any_head_count():
    for heads in (1, 2, 3, 5):
        tree = default_tree(heads)
        assert tree.depth <= heads and tree.num_nodes <= 16
