"""``medusa-lite calibrate`` on a tiny random model: costs, accuracies, the choice, tree.json."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_checkpoint import NUM_HEADS, TOPK_ACCURACY, save_tiny_checkpoint
from tiny_models import OracleMedusaModel, random_heads, tiny_base_model
from transformers import DynamicCache

from medusa_lite import MedusaModel
from medusa_lite.artifacts.loading import load, read_tree_file, verification_rows
from medusa_lite.bench.measure import plain_generate
from medusa_lite.cli import main as cli_main
from medusa_lite.commands import calibrate as calibrate_tree
from medusa_lite.cpu.prepack import default_backend, prepacked_rows
from medusa_lite.decoding.generate import DEFAULT_LOOKUP_TOKENS
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.trees.costs import step_costs
from medusa_lite.trees.dynamic_tree import DEFAULT_MAX_NODES, DEFAULT_TOKENS_PER_COST
from medusa_lite.trees.tree import Tree, best_tree, expected_accepted_tokens

QUICK_ARGS = [
    "--dtype",
    "fp32",
    "--threads",
    "1",
    "--sizes",
    "1,2,4,8",
    "--prefix-tokens",
    "32",
    "--repeats",
    "2",
    "--warmup",
    "1",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(
        tmp_path_factory.mktemp("calibrate"), training_summary={"topk_accuracy": TOPK_ACCURACY}
    )


def test_choice_maximises_predicted_speedup():
    sizes = [1, 2, 4, 8, 16, 32]
    trees = calibrate_tree.trees_for_sizes(TOPK_ACCURACY, sizes)
    # Cost flat up to 8 nodes, then steep: 8 nodes should win.
    step_ms = {1: 10.0, 2: 10.0, 4: 10.0, 8: 10.5, 16: 20.0, 32: 40.0}
    costs = [calibrate_tree.StepCost(n, step_ms[n], step_ms[n]) for n in sizes]
    rows = calibrate_tree.prediction_table(trees, costs, TOPK_ACCURACY)
    assert (
        rows[0].relative_cost == 1.0 and rows[0].expected_accepted_tokens == 1.0 and rows[0].predicted_speedup == 1.0
    )
    for row, tree in zip(rows, trees):
        assert row.num_nodes == tree.num_nodes
        assert row.expected_accepted_tokens == pytest.approx(expected_accepted_tokens(tree, TOPK_ACCURACY))
        assert row.predicted_speedup == pytest.approx(row.expected_accepted_tokens / (step_ms[row.num_nodes] / 10.0))
    assert calibrate_tree.best_row(rows).num_nodes == 8
    assert "<- chosen" in calibrate_tree.format_table(rows, calibrate_tree.best_row(rows))


def test_timed_step_leaves_the_cache_as_it_was():
    base = tiny_base_model()
    model = MedusaModel(base, random_heads(base, NUM_HEADS))
    cache = DynamicCache()
    with torch.inference_mode():
        prefill = model.target_forward(torch.arange(20)[None], cache=cache, use_cache=True)
        keys = cache.layers[0].keys.clone()
        verify_s, step_s = calibrate_tree.timed_step(
            model, cache, prefill.hidden[0, -1], prefill.logits[0, -1:].argmax(-1), best_tree(TOPK_ACCURACY, 8)
        )
    assert 0 < verify_s <= step_s
    assert cache.get_seq_length() == 20 and torch.equal(cache.layers[0].keys, keys)


def test_measure_step_costs_on_tiny_model():
    base = tiny_base_model()
    model = MedusaModel(base, random_heads(base, NUM_HEADS))
    trees = calibrate_tree.trees_for_sizes(TOPK_ACCURACY, [1, 4, 8])
    costs = calibrate_tree.measure_step_costs(model, trees, prefix_tokens=24, repeats=2, warmup=1)
    assert [c.num_nodes for c in costs] == [1, 4, 8]
    assert all(0 < c.verify_ms <= c.step_ms for c in costs)


@pytest.mark.skipif(default_backend() is None, reason="neither the row_gemm kernel nor oneDNN is available")
def test_packed_timing_packs_once_and_interleaves_sizes(monkeypatch):
    """One packed copy for the largest tree (+ lookup chain); every round times each tree once, in a shuffled order."""
    base = tiny_base_model()
    model = MedusaModel(base, random_heads(base, NUM_HEADS))
    trees = calibrate_tree.trees_for_sizes(TOPK_ACCURACY, [1, 4, 8])
    timed: list[tuple[int, int | None]] = []
    original = calibrate_tree.timed_step

    def recording(model, cache, hidden, root, tree):
        timed.append((tree.num_nodes, prepacked_rows(model.base_model)))
        return original(model, cache, hidden, root, tree)

    monkeypatch.setattr(calibrate_tree, "timed_step", recording)
    calibrate_tree.measure_step_costs(model, trees, prefix_tokens=24, repeats=5, warmup=1, prepack=True)
    assert {rows for _, rows in timed} == {verification_rows(8)}
    rounds = [sorted(nodes for nodes, _ in timed[start : start + 3]) for start in range(0, len(timed), 3)]
    assert rounds == [[1, 4, 8]] * 6  # 1 warm-up + 5 timed rounds
    assert len({tuple(nodes for nodes, _ in timed[start : start + 3]) for start in range(0, len(timed), 3)}) > 1, (
        "orders are shuffled"
    )


def test_measured_accuracy_of_oracle_heads_is_perfect():
    base = tiny_base_model(logit_scale=4.0)
    prompt = torch.arange(5, 17)[None]
    new_tokens = plain_generate(base, prompt, 24, SamplingSettings())
    oracle = OracleMedusaModel(base, random_heads(base, NUM_HEADS), torch.cat([prompt[0], new_tokens]))
    accuracy = calibrate_tree.measure_topk_accuracy(oracle, [prompt], max_new_tokens=24, max_rank=3)
    assert [head[0] for head in accuracy] == [1.0] * NUM_HEADS
    random_model = MedusaModel(base, random_heads(base, NUM_HEADS))
    random_accuracy = calibrate_tree.measure_topk_accuracy(random_model, [prompt], max_new_tokens=24, max_rank=3)
    assert len(random_accuracy) == NUM_HEADS and all(len(head) == 3 for head in random_accuracy)
    assert all(0.0 <= value <= 1.0 for head in random_accuracy for value in head)


def test_read_prompts(tmp_path):
    (tmp_path / "p.txt").write_text("first prompt\n\nsecond prompt\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"turns": ["b", "c"]}) + "\n")
    assert calibrate_tree.read_prompts(tmp_path / "p.txt") == ["first prompt", "second prompt"]
    assert calibrate_tree.read_prompts(tmp_path / "p.jsonl") == ["a", "b"]


def test_calibration_writes_tree_json_that_load_uses(checkpoint, capsys):
    model_dir, heads_dir = checkpoint
    assert calibrate_tree.main(["--model", str(model_dir), "--heads", str(heads_dir), *QUICK_ARGS]) == 0
    out = capsys.readouterr().out
    assert "pred. speed-up" in out and "<- chosen" in out
    written = json.loads((heads_dir / "tree.json").read_text())
    assert [row["num_nodes"] for row in written["table"]] == [1, 2, 4, 8]
    assert written["accuracy_source"] == "heads' training_summary" and written["topk_accuracy"] == TOPK_ACCURACY
    assert written["machine"]["torch_threads"] == 1 and written["machine"]["dtype"] == "float32"
    chosen = written["chosen"]["num_nodes"]
    assert chosen == max(written["table"], key=lambda row: row["predicted_speedup"])["num_nodes"]
    assert Tree.from_paths(written["paths"]) == best_tree(TOPK_ACCURACY, chosen)
    # The dynamic policy: portable settings only; load prices it with this machine's costs (medusa_lite.trees.costs).
    assert written["dynamic"] == {"max_nodes": DEFAULT_MAX_NODES, "tokens_per_cost": DEFAULT_TOKENS_PER_COST}
    loaded = load(model_dir, heads=heads_dir, dtype=torch.float32)[0]
    costs = step_costs(loaded, DEFAULT_MAX_NODES + DEFAULT_LOOKUP_TOKENS)  # cached by the load just above
    assert loaded.tree == read_tree_file(heads_dir / "tree.json").pruned(NUM_HEADS).with_costs(
        costs.row_costs, costs.proposal_cost
    )
    assert read_tree_file(heads_dir / "tree.json", dynamic=False) == best_tree(TOPK_ACCURACY, chosen)
    # A static tree chosen elsewhere (e.g. by a replay with the lookup chain) is kept as given.
    assert (
        calibrate_tree.main(
            ["--model", str(model_dir), "--heads", str(heads_dir), "--static-paths", "[[0], [1]]", *QUICK_ARGS]
        )
        == 0
    )
    assert read_tree_file(heads_dir / "tree.json", dynamic=False) == Tree.from_paths([[0], [1]])
    assert json.loads((heads_dir / "tree.json").read_text())["static_paths_source"] == "--static-paths"
    # Without a dynamic policy, load decodes with the static tree.
    assert (
        calibrate_tree.main(
            ["--model", str(model_dir), "--heads", str(heads_dir), "--dynamic-max-nodes", "0", *QUICK_ARGS]
        )
        == 0
    )
    static_only = json.loads((heads_dir / "tree.json").read_text())  # timed afresh: its own choice
    assert "dynamic" not in static_only
    assert load(model_dir, heads=heads_dir, dtype=torch.float32)[0].tree == best_tree(
        TOPK_ACCURACY, static_only["chosen"]["num_nodes"]
    )
    (heads_dir / "tree.json").unlink()


def test_calibration_measures_accuracy_on_prompts(checkpoint, tmp_path, capsys):
    model_dir, heads_dir = checkpoint
    (tmp_path / "prompts.txt").write_text("Why is the sky blue?\nWrite a short poem about the sea.\n")
    out_file = tmp_path / "tree.json"
    args = [
        "--model",
        str(model_dir),
        "--heads",
        str(heads_dir),
        "--measure-on",
        str(tmp_path / "prompts.txt"),
        "--measure-tokens",
        "12",
        "--max-rank",
        "4",
        "--out",
        str(out_file),
    ]
    assert calibrate_tree.main([*args, *QUICK_ARGS]) == 0
    written = json.loads(out_file.read_text())
    assert written["accuracy_source"].startswith("measured on 2 prompts")
    assert len(written["topk_accuracy"]) == NUM_HEADS and all(len(head) == 4 for head in written["topk_accuracy"])
    assert not (heads_dir / "tree.json").exists()


def test_costs_only_needs_no_heads_and_writes_no_tree(checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("medusa_lite.artifacts.loading.DEFAULT_HEADS_DIR", tmp_path / "not-shipped-yet")
    model_dir, _ = checkpoint
    assert (
        calibrate_tree.main(
            ["--model", str(model_dir), "--costs-only", *QUICK_ARGS, "--out", str(tmp_path / "costs.json")]
        )
        == 0
    )
    assert "verify ms" in capsys.readouterr().out
    written = json.loads((tmp_path / "costs.json").read_text())
    assert "paths" not in written and len(written["table"]) == 4


def test_missing_accuracies_are_a_clear_error(tmp_path, capsys):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    assert cli_main(["calibrate", "--model", str(model_dir), "--heads", str(heads_dir), *QUICK_ARGS]) == 2
    assert "--measure-on" in capsys.readouterr().err
