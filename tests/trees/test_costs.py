"""Step costs measured on the machine that decodes (:mod:`medusa_lite.trees.costs`): measured once per
machine / dtype / threads / kernel / model, cached, and never taken from another machine's tree file."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from concurrent_calls import results_of_concurrent_calls
from tiny_checkpoint import save_tiny_checkpoint
from tiny_models import random_heads, tiny_base_model

import medusa_lite.trees.costs as costs
from medusa_lite import DynamicTree, MedusaModel, load
from medusa_lite.artifacts.loading import verification_rows, write_tree_file
from medusa_lite.cpu.kernels import KERNEL_ENV_VAR, kernel_path
from medusa_lite.cpu.prepack import ONEDNN, onednn_available, prepack_linears
from medusa_lite.trees.tree import Tree

OTHER_MACHINES_COSTS = [1.0] * 14  # "rows are free": an AVX-512 machine's file, say


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_LITE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tiny_model() -> MedusaModel:
    base = tiny_base_model("llama", vocab_size=96, seed=3)
    return MedusaModel(base, random_heads(base, num_heads=3, seed=4)).eval()


def test_first_use_measures_and_caches_then_reads_the_cache(cache, monkeypatch):
    model = tiny_model()
    messages = []
    measured = costs.step_costs(model, 10, announce=messages.append)
    assert (
        len(measured.row_costs) == 10 and all(cost > 0 for cost in measured.row_costs) and measured.proposal_cost > 0
    )
    assert (
        measured.plain_step_ms > 0
        and measured.seconds > 0
        and measured.key == costs.cost_key(model, costs.heads_proposal(model, 10))
    )
    path = costs.cost_cache_path(measured.key)
    assert path.parent == cache / "costs" and json.loads(path.read_text())["row_costs"] == list(measured.row_costs)
    assert len(messages) == 1 and "measured this machine's step costs" in messages[0] and str(path) in messages[0]

    monkeypatch.setattr(
        costs, "measure_row_costs", lambda *args, **kwargs: pytest.fail("measured again despite the cache")
    )
    assert costs.step_costs(model, 10, announce=messages.append) == measured and len(messages) == 1
    assert costs.step_costs(model, 6, announce=messages.append) == measured  # fewer rows: the same table serves


def test_the_cache_is_per_threads_dtype_kernel_and_model(cache, monkeypatch):
    model = tiny_model()
    key = costs.cost_key(model)
    assert {"cpu", "cpu_capability", "device", "dtype", "threads", "kernel", "prepack", "model"} <= key.keys()
    assert key["kernel"] == (kernel_path().variant or "off") and key["threads"] == torch.get_num_threads()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert costs.cost_cache_path(costs.cost_key(model)) != costs.cost_cache_path(key)
    finally:
        torch.set_num_threads(threads)
    assert costs.cost_cache_path(costs.cost_key(model.to(torch.float64))) != costs.cost_cache_path(key)
    monkeypatch.setattr(costs, "kernel_path", lambda: dataclasses.replace(kernel_path(), variant=None))
    assert costs.cost_key(tiny_model())["kernel"] == "off"


@pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN linear")
def test_the_cache_is_per_packed_layout():
    """Costs measured on another packed layout (backend, rows) do not price this one's rows."""
    model = tiny_model()
    unpacked = costs.cost_key(model)
    prepack_linears(model.base_model, 8, ONEDNN)
    eight = costs.cost_key(model)
    prepack_linears(model.base_model, 14, ONEDNN)
    fourteen = costs.cost_key(model)
    assert unpacked["prepack"] is None and eight["prepack"] == {"backend": ONEDNN, "rows": 8}
    assert fourteen["prepack"]["rows"] == 14
    assert len({costs.cost_cache_path(key) for key in (unpacked, eight, fourteen)}) == 3


def test_a_stale_or_foreign_cache_file_is_measured_again(cache):
    model = tiny_model()
    key = costs.cost_key(model)
    path = costs.cost_cache_path(key)
    foreign = costs.StepCosts((1.0,) * 14, 0.0, 1.0, {**key, "cpu": "another CPU"}, 1.0)
    costs.write_cached_costs(path, foreign)
    assert (
        costs.read_cached_costs(path, key, 14) is None
    )  # measured for another key (a hash collision, a copied folder)
    path.write_text("{not json")
    assert costs.read_cached_costs(path, key, 14) is None
    costs.write_cached_costs(path, dataclasses.replace(foreign, key=key, row_costs=(1.0,) * 4))
    assert costs.read_cached_costs(path, key, 14) is None  # too few rows for this policy
    assert costs.read_cached_costs(path, key, 4) is not None


def test_a_tree_file_from_another_machine_does_not_override_measured_costs(tmp_path, cache):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    policy = DynamicTree(8, tuple(OTHER_MACHINES_COSTS), tokens_per_cost=1.5)
    write_tree_file(heads_dir / "tree.json", Tree.from_paths([[0], [1]]), {}, policy)
    values = json.loads((heads_dir / "tree.json").read_text())
    values["dynamic"]["row_costs"] = OTHER_MACHINES_COSTS  # as files from before this change hold them
    (heads_dir / "tree.json").write_text(json.dumps(values))

    # No costs cached: load measures this machine's and decodes with them, not the file's.
    model = load(model_dir, heads=heads_dir, dtype=torch.float32)[0]
    measured = costs.step_costs(model, verification_rows(8))  # now cached
    assert model.tree.row_costs == pytest.approx(DynamicTree(8, measured.row_costs).row_costs)
    assert model.tree.row_costs != pytest.approx(tuple(OTHER_MACHINES_COSTS))
    assert (
        model.tree.proposal_cost == measured.proposal_cost and model.tree.tokens_per_cost == 1.5
    )  # portable settings kept

    # This machine's costs cached (here: steep ones): they win over the file's too.
    steep = dataclasses.replace(measured, row_costs=tuple(1.0 + 0.5 * r for r in range(verification_rows(8))))
    costs.write_cached_costs(costs.cost_cache_path(measured.key), steep)
    model = load(model_dir, heads=heads_dir, dtype=torch.float32)[0]
    assert model.tree.row_costs == pytest.approx(steep.row_costs)


def test_a_policy_given_as_an_object_keeps_its_costs(tmp_path, cache):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    policy = DynamicTree(6, (1.0, 1.1, 1.2))
    model = load(model_dir, heads=heads_dir, dtype=torch.float32, tree=policy)[0]
    assert model.tree.row_costs == policy.row_costs and not (cache / "costs").exists()


def test_unknown_kernel_choice_fails_before_measuring(cache, monkeypatch):
    monkeypatch.setenv(KERNEL_ENV_VAR, "fast")
    kernel_path.cache_clear()
    try:
        with pytest.raises(Exception, match="MEDUSA_LITE_KERNEL='fast'"):
            costs.step_costs(tiny_model(), 4)
    finally:
        kernel_path.cache_clear()


def test_requests_arriving_together_wait_for_one_measurement(cache, monkeypatch):
    """Four threads needing the missing step costs at once: one measures, the rest read what it cached."""
    model = tiny_model()
    key = costs.cost_key(model, costs.heads_proposal(model, 6))
    measurements: list[int] = []

    def slow_measurement(model, max_rows, proposal):
        measurements.append(max_rows)
        time.sleep(0.3)  # long enough for every thread to find the entry missing
        return costs.StepCosts(tuple(1.0 + 0.1 * r for r in range(max_rows)), 0.05, 10.0, key, 0.3)

    monkeypatch.setattr(costs, "measure_row_costs", slow_measurement)
    results = results_of_concurrent_calls(lambda: costs.step_costs(model, 6, announce=print), threads=4)
    assert measurements == [6], f"measured {len(measurements)} times"
    assert len(results) == 4 and all(result == results[0] for result in results)
