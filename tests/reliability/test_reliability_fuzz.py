"""Fuzzing the files the earlier properties did not reach (:mod:`file_mutations`): every drafter kind's folder
(``config.json`` and ``model.safetensors``, whose header is rewritten as well as its bytes), the vLLM export layout
``import_heads`` reads, both step-cost caches, and a training checkpoint that ``--resume`` restores.

Each corrupted file either loads (it still says something valid) or ends in a ``MedusaError`` whose message names
the file it came from; never another exception, a hang (every call is timed) or a huge allocation (a claimed
size of 2**62 bytes is among the mutations). A cost cache never errs: what it cannot use is measured again, and
what it returns is finite and positive. Examples are derandomized so the counts below are the same on every run.
"""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest
import training_fixtures
from file_mutations import corrupt_file, corrupt_safetensors, mutate_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import random_heads, tiny_base_model
from training_fixtures import tiny_argv

from medusa_lite import DynamicTree, MedusaError, attach
from medusa_lite.commands import train as train_heads
from medusa_lite.decoding.batch_costs import BATCH_COSTS_FORMAT, read_cached_batch_costs
from medusa_lite.drafters.registry import kind_named, kind_names
from medusa_lite.export.vllm_medusa import export_heads, import_heads
from medusa_lite.training.config import TrainConfig
from medusa_lite.trees.costs import StepCosts, read_cached_costs

tiny_target, pattern_data, single_thread = (
    training_fixtures.tiny_target,
    training_fixtures.pattern_data,
    training_fixtures.single_thread,
)

VOCAB = 40
NUM_HEADS = 2
BASE = tiny_base_model("llama", vocab_size=VOCAB, seed=31, max_position_embeddings=64)
EXAMPLES = 40
# Costs given: no step costs measured for a mutated config (a dynamic tree, which every kind takes)
STATIC_TREE = DynamicTree(4, (1.0, 1.1, 1.2, 1.3))
SLOWEST_CALL_S = 10.0  # far above any read of these tiny files: a call this slow is a hang
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
OUTCOMES: dict[str, dict[str, int]] = {}


def outcome(what: str, names: tuple[str, ...], call) -> None:
    """Run ``call``: it loads, or raises a MedusaError naming one of ``names``; count which, and time it."""
    started = time.perf_counter()
    try:
        call()
        result = "read"
    except MedusaError as error:
        assert any(name in str(error) for name in names), f"{what}: the error does not name {names}: {error}"
        result = "refused"
    seconds = time.perf_counter() - started
    assert seconds < SLOWEST_CALL_S, f"{what}: one call took {seconds:.1f} s"
    counts = OUTCOMES.setdefault(what, {"refused": 0, "read": 0})
    counts[result] += 1


def copied(source, destination):
    shutil.copytree(source, destination)
    return destination


# -- every drafter kind's folder ------------------------------------------------------------------
@pytest.fixture(scope="module")
def kind_folders(tmp_path_factory):
    folders = {}
    for name in kind_names():
        config = TrainConfig(data=["unused"], drafter=name, num_heads=NUM_HEADS)
        artifact = kind_named(name).training.fresh(config, BASE, None)
        folders[name] = tmp_path_factory.mktemp(name)
        artifact.save_pretrained(folders[name])
    return folders


@pytest.mark.parametrize("kind", kind_names())
@FUZZ
@given(data=st.data(), name=st.sampled_from(["config.json", "model.safetensors"]))
def test_corrupted_drafter_folder_of_every_kind(tmp_path_factory, kind_folders, data, kind, name):
    folder = copied(kind_folders[kind], tmp_path_factory.mktemp("corrupt") / kind)
    if name == "model.safetensors":
        corrupt_safetensors(data, folder / name)
    else:
        corrupt_file(data, folder / name, parse_json=True)
    outcome(f"{kind} folder", (name, str(folder)), lambda: attach(BASE, folder, tree=STATIC_TREE, datastore=False))


# -- the vLLM export layout -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm")
    export_heads(random_heads(BASE, num_heads=NUM_HEADS, seed=3), BASE.lm_head, folder)
    return folder


@FUZZ
@given(data=st.data(), name=st.sampled_from(["config.json", "model.safetensors"]))
def test_corrupted_vllm_export_folder(tmp_path_factory, vllm_folder, data, name):
    folder = copied(vllm_folder, tmp_path_factory.mktemp("corrupt") / "vllm")
    if name == "model.safetensors":
        corrupt_safetensors(data, folder / name)
    else:
        corrupt_file(data, folder / name, parse_json=True)
    outcome("vLLM folder", (name, str(folder)), lambda: import_heads(folder))


# -- the step-cost caches -------------------------------------------------------------------------
KEY = {"model": "tiny", "rows": 4}
STEP_COSTS = StepCosts((1.0, 1.1, 1.3, 1.6), 0.05, 12.5, KEY, 3.2)
BATCH_COSTS = {
    "format": BATCH_COSTS_FORMAT,
    "batch_size": 4,
    "row_costs": [1.0, 1.2, 1.5, 1.8, 2.1, 2.4, 2.8, 3.1],
    "plain_step_ratio": 1.3,
    "key": KEY,
}


def assert_usable(numbers, what: str) -> None:
    assert all(isinstance(n, float) and math.isfinite(n) and n > 0 for n in numbers), f"{what}: {numbers}"


def measured_again_or_usable(costs, numbers) -> str:
    if costs is None:
        return "measured again"
    assert_usable(numbers(costs), "a cached cost the decoding would use")
    return "read"


COST_OUTCOMES: dict[str, dict[str, int]] = {}


@pytest.mark.parametrize("which", ["step", "batch"])
@FUZZ
@given(data=st.data(), how=st.sampled_from(["as written", "values", "numbers", "bytes"]))
def test_a_corrupted_cost_cache_is_measured_again_or_is_usable(tmp_path_factory, data, which, how):
    path = tmp_path_factory.mktemp("costs") / "costs.json"
    values = STEP_COSTS.as_dict() if which == "step" else BATCH_COSTS
    path.write_text(json.dumps(values))
    if how == "values":  # any JSON node changed
        path.write_text(json.dumps(mutate_json(data, values)))
    elif how == "numbers":  # NaN and infinities included, as json.dumps writes them
        path.write_text(json.dumps(nonsense(data, values)))
    elif how == "bytes":
        corrupt_file(data, path, parse_json=False)
    if which == "step":
        costs = read_cached_costs(path, KEY, 4)
        result = measured_again_or_usable(costs, lambda c: (*c.row_costs, c.plain_step_ms))
        assert costs is None or costs.proposal_cost >= 0 and math.isfinite(costs.proposal_cost)
    else:
        costs = read_cached_batch_costs(path, KEY, 4)
        result = measured_again_or_usable(costs, lambda c: (*c.row_costs, c.plain_step_ratio))
    counts = COST_OUTCOMES.setdefault(which, {"measured again": 0, "read": 0})
    counts[result] += 1


def nonsense(data, values: dict) -> dict:
    """``values`` with one number set to what a half-broken writer or a hand edit could leave."""
    field = data.draw(st.sampled_from(["row_costs", "plain_step_ms", "plain_step_ratio", "proposal_cost"]))
    bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -0.5, 0.0, 1e308, -(10**30)]))
    changed = dict(values)
    if field == "row_costs":
        costs = list(changed["row_costs"])
        costs[data.draw(st.integers(0, len(costs) - 1))] = bad
        changed["row_costs"] = costs
    elif field in changed:
        changed[field] = bad
    return changed


# -- a training checkpoint ------------------------------------------------------------------------
CHECKPOINT_FILES = ["trainer_state.json", "model.safetensors", "optimizer.bin", "random_states_0.pkl", "COMPLETE"]


@pytest.fixture(scope="module")
def trained_run(tiny_target, pattern_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    train_heads.main(tiny_argv(tiny_target, pattern_data, out, max_steps=10, checkpoint_every=10))
    shutil.rmtree(out / "heads")
    return out


@settings(FUZZ, max_examples=EXAMPLES // 2)
@given(data=st.data(), name=st.sampled_from(CHECKPOINT_FILES))
def test_corrupted_checkpoint_is_resumed_or_refused_naming_the_file(
    tmp_path_factory, tiny_target, pattern_data, trained_run, data, name
):
    out = copied(trained_run, tmp_path_factory.mktemp("resume") / "out")
    path = out / "checkpoints" / "step-00000010" / name
    if name == "model.safetensors":
        corrupt_safetensors(data, path)
    else:
        corrupt_file(data, path, parse_json=name.endswith(".json"))
    argv = tiny_argv(tiny_target, pattern_data, out, max_steps=11, checkpoint_every=10) + ["--resume"]
    outcome("checkpoint", (name, "step-00000010"), lambda: train_heads.main(argv))


def test_the_fuzzers_reached_both_outcomes():
    """Run after the fuzzers (file order): each format had examples refused (or measured again) and read."""
    if not OUTCOMES:
        pytest.skip("run together with the fuzzers")
    for what, counts in {**OUTCOMES, **COST_OUTCOMES}.items():
        assert all(counts.values()), (what, counts)
    print(json.dumps({"outcomes": OUTCOMES, "cost caches": COST_OUTCOMES}, indent=1))
