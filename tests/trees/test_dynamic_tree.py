"""Dynamic trees: each step's tree from the heads' confidence and the cost of verifying rows."""

import json

import pytest
import torch
from tiny_models import OracleMedusaModel, PartlyRightOracle, plain_greedy, random_heads, tiny_base_model

from medusa_lite import DynamicTree, Tree, TreeError, generate
from medusa_lite.artifacts.loading import read_tree_file, write_tree_file
from medusa_lite.trees.costs import row_costs_from_ratios
from medusa_lite.trees.dynamic_tree import UNMEASURED_ROW_COSTS, chain_prefixes, chain_ranks, row_costs_from_table
from medusa_lite.trees.tree import best_tree, ranked_paths

FLAT_COSTS = (1.0,) * 32  # every row free: a step keeps all the nodes it may
CONFIDENT = [[0.9, 0.05, 0.03], [0.8, 0.1, 0.05], [0.7, 0.1, 0.05]]
UNSURE = [[0.3, 0.25, 0.2], [0.1, 0.05, 0.05], [0.05, 0.05, 0.05]]
# A step of r rows costs 1 + 0.05 (r - 1): a node pays its way when its path is > 0.1 likely (at 2 tokens per unit).
GENTLE_COSTS = tuple(1.0 + 0.05 * rows for rows in range(32))


def path_probability(table, path):
    probability = 1.0
    for depth, rank in enumerate(path):
        probability *= table[depth][rank]
    return probability


def test_ranked_paths_are_best_first_and_every_prefix_is_a_tree():
    ranked = ranked_paths(CONFIDENT, 12)
    probabilities = [p for p, _ in ranked]
    assert probabilities == sorted(probabilities, reverse=True)
    assert all(p == pytest.approx(path_probability(CONFIDENT, path)) for p, path in ranked)
    for count in range(len(ranked) + 1):
        Tree.from_paths([path for _, path in ranked[:count]])  # raises if a parent is missing
    # Exhaustive check on a small table: the top 5 are the 5 likeliest of all paths.
    every = [(path_probability(UNSURE, (a,)), (a,)) for a in range(3)]
    every += [(path_probability(UNSURE, (a, b)), (a, b)) for a in range(3) for b in range(3)]
    every += [(path_probability(UNSURE, (a, b, c)), (a, b, c)) for a in range(3) for b in range(3) for c in range(3)]
    assert sorted(p for p, _ in ranked_paths(UNSURE, 5)) == pytest.approx(sorted(p for p, _ in every)[-5:])


def test_best_tree_is_the_top_ranked_paths():
    assert set(best_tree(CONFIDENT, 6).paths) == {path for _, path in ranked_paths(CONFIDENT, 5)}


def test_confident_heads_get_a_deep_tree_unsure_ones_a_wide_one():
    policy = DynamicTree(4, GENTLE_COSTS)
    assert policy.choose(CONFIDENT).paths == ((0,), (0, 0), (0, 0, 0))
    assert policy.choose(UNSURE).paths == ((0,), (1,), (2,))


def test_tree_size_follows_the_price_of_rows():
    assert DynamicTree(6, FLAT_COSTS).choose(UNSURE).num_nodes == 6  # free rows: take all
    assert DynamicTree(6, (1.0,) + (100.0,) * 10).choose(CONFIDENT).num_nodes == 1  # any guess costs too much
    cheap, dear = DynamicTree(8, GENTLE_COSTS, tokens_per_cost=0.5), DynamicTree(8, GENTLE_COSTS, tokens_per_cost=8.0)
    assert cheap.choose(UNSURE).num_nodes > dear.choose(UNSURE).num_nodes
    # Every kept path is worth its extra row: p > tokens_per_cost * 0.05 = 0.1.
    assert all(path_probability(UNSURE, path) > 0.1 for path in DynamicTree(8, GENTLE_COSTS).choose(UNSURE).paths)


def test_chain_tokens_on_kept_nodes_cost_no_extra_row():
    # (0,) is worth 0.12 tokens; its row costs 0.05 * 2 = 0.1 tokens on top of the chain's rows.
    table = [[0.12, 0.01], [0.01, 0.01]]
    policy = DynamicTree(3, GENTLE_COSTS)
    assert policy.choose(table).paths == ((0,),)
    # A 2-token chain elsewhere: 1 + 2 rows without the node, 1 + 1 + 2 with it; still worth it.
    assert policy.choose(table, chain_ranks=[None, None], chain_length=2).paths == ((0,),)
    # With costs that jump at 4 rows, the node is only worth it if the chain's first token sits on it.
    jump = (1.0, 1.0, 1.0, 2.0, 2.0)
    assert DynamicTree(3, jump).choose(table, chain_ranks=[None, None], chain_length=2).paths == ()
    assert DynamicTree(3, jump).choose(table, chain_ranks=[0, None], chain_length=2).paths == ((0,),)


def test_chain_ranks_and_prefixes():
    guesses = torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]])
    assert chain_ranks(guesses, torch.tensor([6, 10, 99, 11])) == [1, 2, None]
    assert chain_ranks(guesses, torch.tensor([], dtype=torch.long)) == []
    assert chain_prefixes([1, 2, None, 0]) == [(1,), (1, 2)]


def test_costs_are_made_monotone_and_extrapolated():
    policy = DynamicTree(4, (1.0, 1.2, 1.1, 1.3))
    assert policy.row_costs == pytest.approx((1.0, 1.15, 1.15, 1.3))  # the dip averaged away
    assert policy.cost(8) == pytest.approx(2.6)
    assert DynamicTree(5, (1.0, 1.3, 1.1, 1.0, 1.4)).row_costs == pytest.approx((1.0, 3.4 / 3, 3.4 / 3, 3.4 / 3, 1.4))
    # a one-row step slower than few-row ones (PyTorch's one-row path against the packed kernel) stays so: pooled with
    # them, it would price every extra row as free
    assert DynamicTree(4, (1.05, 0.65, 0.7, 0.8)).row_costs == pytest.approx((1.05, 0.65, 0.7, 0.8))


def test_extra_rows_are_priced_when_few_rows_are_cheaper_than_a_plain_step():
    """On a CPU whose one-row linear is slow, 2..14 rows measure below a plain step: their growth must survive."""
    ratios = {1: 1.04, 2: 0.64, 3: 0.62, 4: 0.66, 8: 0.74, 14: 0.97}  # 3 rows: timing noise below 2 rows
    costs = row_costs_from_ratios(ratios, 14)
    assert costs[0] == 1.04 and costs[1] == costs[2] == 0.64 and costs[3] == 0.66
    assert costs[4:8] == (0.74,) * 4 and costs[8:] == (0.97,) * 6  # unmeasured sizes: the next larger measured one
    policy = DynamicTree(14, costs)
    assert policy.cost(14) - policy.cost(2) == pytest.approx(0.33)  # 12 more rows cost a third of a plain step
    assert row_costs_from_ratios({1: 0.97, 2: 1.02}, 2) == (1.0, 1.02)  # one row is the plain step's path: noise
    table = [
        {"num_nodes": 1, "relative_cost": 1.0},
        {"num_nodes": 4, "relative_cost": 1.2},
        {"num_nodes": 8, "relative_cost": 1.6},
    ]
    assert row_costs_from_table(table, 10) == pytest.approx((1.0, 1.2, 1.2, 1.2, 1.6, 1.6, 1.6, 1.6, 1.8, 2.0))


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((0, (1.0,)), "max_nodes"),
        ((4, ()), "row_costs"),
        ((4, (1.0, -1.0)), "row_costs"),
        ((4, (1.0, float("nan"))), "row_costs"),
        ((4, (1.0,), 0.0), "tokens_per_cost"),
    ],
)
def test_bad_policies_are_refused(arguments, message):
    with pytest.raises(TreeError, match=message):
        DynamicTree(*arguments)


@pytest.mark.parametrize("tokens_per_cost", [0.01, 2.0])
@pytest.mark.parametrize("lookup_tokens", [0, 4])
def test_partly_right_heads_match_plain_greedy(tokens_per_cost, lookup_tokens, monkeypatch):
    """Each step's tree has several nodes (cheap or dear rows alike), head guesses are accepted, output is exact."""
    chosen_nodes = []
    choose = DynamicTree.choose

    def recorded_choose(self, *args, **kwargs):
        tree = choose(self, *args, **kwargs)
        chosen_nodes.append(tree.num_nodes)
        return tree

    monkeypatch.setattr(DynamicTree, "choose", recorded_choose)
    base = tiny_base_model("llama", vocab_size=96, seed=3)
    policy = DynamicTree(8, GENTLE_COSTS, tokens_per_cost)
    generator = torch.Generator().manual_seed(5)
    steps = head_guesses_accepted = 0
    root_alone = []  # per run: steps before the last whose tree was the root alone
    for index in range(6):
        prompt = torch.randint(0, 96, (1, int(torch.randint(1, 20, (1,), generator=generator))), generator=generator)
        expected = plain_greedy(base, prompt, 40)
        model = PartlyRightOracle(base, random_heads(base, num_heads=3, seed=4), expected[0], seed=index)
        out = generate(model, prompt, 40, tree=policy, lookup_tokens=lookup_tokens, datastore=False)
        assert torch.equal(out.sequences, expected)
        run_nodes = chosen_nodes[steps:]
        root_alone.append(sum(nodes == 1 for nodes in run_nodes[:-1]))  # the last step may have room for no guess
        steps += out.stats.steps
        # Steps that accepted a guess without a lookup-only guess on their path accepted head guesses.
        head_guesses_accepted += sum(t > 1 for t in out.stats.tokens_per_step) - out.stats.lookup_steps
    assert len(chosen_nodes) == steps, "the dynamic policy did not choose every step's tree"
    assert root_alone == [0] * len(root_alone), f"steps verified the root alone (trees chosen: {chosen_nodes})"
    assert head_guesses_accepted > steps // 4, f"only {head_guesses_accepted} of {steps} steps accepted a head guess"


class ConfidentOracle(OracleMedusaModel):
    """Oracle heads whose softmax puts nearly all mass on the right guess."""

    def head_logits(self, hidden, num_heads=None, next_tokens=None):
        return 50.0 * super().head_logits(hidden, num_heads, next_tokens)


def test_confident_oracle_goes_as_deep_as_the_heads_every_step():
    base = tiny_base_model("llama", vocab_size=96, seed=7)
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(8))
    expected = plain_greedy(base, prompt, 40)
    oracle = ConfidentOracle(base, random_heads(base, num_heads=4), expected[0])
    out = generate(oracle, prompt, 40, tree=DynamicTree(8, GENTLE_COSTS), lookup_tokens=0, datastore=False)
    assert torch.equal(out.sequences, expected)
    assert out.stats.tokens_per_step[:-1] == [5] * (out.stats.steps - 1)  # 4 heads + the bonus
    assert out.stats.tree_depth == 4  # bound to the heads there are


def test_tree_file_round_trip_with_a_dynamic_policy(tmp_path):
    policy = DynamicTree(6, (1.0, 1.1, 1.2), tokens_per_cost=1.5)
    path = write_tree_file(tmp_path / "tree.json", Tree.from_paths([[0], [1]]), {"note": "test"}, policy)
    assert "row_costs" not in json.loads(path.read_text())["dynamic"]  # costs belong to the machine that decodes
    assert read_tree_file(path) == policy.with_costs(UNMEASURED_ROW_COSTS)  # until load measures this machine's
    assert read_tree_file(path, dynamic=False) == Tree.from_paths([[0], [1]])
    values = json.loads(path.read_text())
    values["dynamic"]["row_costs"] = [1.0, 1.0]  # an older file's costs, from another machine: read, not used
    path.write_text(json.dumps(values))
    assert read_tree_file(path) == policy.with_costs(UNMEASURED_ROW_COSTS)
    values["dynamic"]["row_costs"] = "fast"
    path.write_text(json.dumps(values))
    with pytest.raises(TreeError, match="'dynamic' must be an object"):
        read_tree_file(path)
    values["dynamic"]["row_costs"] = [1.0, -2.0]
    path.write_text(json.dumps(values))
    with pytest.raises(TreeError, match="tree.json: row_costs"):
        read_tree_file(path)
