"""Sequential-drafter training end to end through ``train/train_heads.py`` (``--drafter sequential``) on a tiny
model.
"""

from __future__ import annotations

import json

import pytest
import torch
import training_fixtures
from tiny_tokenizer import TINY_VOCAB_SIZE
from training_fixtures import tiny_argv
from transformers import AutoModelForCausalLM

from medusa_lite.commands import train as train_heads
from medusa_lite.drafters.sequential.drafter import DRAFTER_KIND, SequentialDrafter
from medusa_lite.training import TrainingConfigError
from medusa_lite.training.drafter_objective import feature_regression
from medusa_lite.training.losses import states_ahead

tiny_target, pattern_data, single_thread = (
    training_fixtures.tiny_target,
    training_fixtures.pattern_data,
    training_fixtures.single_thread,
)

CHANCE = 1 / TINY_VOCAB_SIZE


@pytest.fixture(scope="module")
def trained(tiny_target, pattern_data, tmp_path_factory):
    torch.set_num_threads(1)
    return train_heads.main(
        tiny_argv(
            tiny_target, pattern_data, tmp_path_factory.mktemp("run") / "out", drafter="sequential", learning_rate=3e-3
        )
    )


def test_drafter_learns_every_depth_on_held_out_data(trained):
    summary = trained.summary
    assert summary["drafter"] == "sequential"
    top1, chain = summary["top1_accuracy"], summary["chain_top1_accuracy"]
    assert len(top1) == len(chain) == 3
    assert chain[0] == pytest.approx(top1[0], abs=1e-4)  # depth 1 has no earlier depth
    assert all(c <= t + 1e-4 for c, t in zip(chain, top1)) and chain == sorted(chain, reverse=True)
    assert chain[2] > 0.5, f"depth-3 chain accuracy {chain[2]} (chance {CHANCE**3:.2g})"
    losses = [entry["train/loss"] for entry in trained.history if "train/loss" in entry]
    assert losses[-1] < 0.5 * losses[0]


def test_saved_drafter_loads_strictly_with_its_kind_and_summary(trained, tiny_target):
    drafter = SequentialDrafter.from_pretrained(trained.heads_dir)
    assert drafter.config.kind == DRAFTER_KIND and drafter.config.depth == 3
    assert drafter.config.training_summary["chain_top1_accuracy"] == trained.summary["chain_top1_accuracy"]
    base = AutoModelForCausalLM.from_pretrained(tiny_target)
    assert drafter.config.hidden_size == base.config.hidden_size and drafter.config.base_model_name_or_path == str(
        tiny_target
    )


def test_cached_hidden_states_cover_the_prompt_and_match_live_forwards(tiny_target, pattern_data, tmp_path):
    runs = {}
    for cached in (False, True):
        argv = tiny_argv(
            tiny_target,
            pattern_data,
            tmp_path / f"cached-{cached}",
            drafter="sequential",
            max_steps=3,
            log_every=1,
            precompute_hidden=cached,
        )
        runs[cached] = train_heads.main(argv)
    live, cached = ([e["train/loss"] for e in runs[c].history if "train/loss" in e] for c in (False, True))
    assert len(live) == len(cached) == 3
    torch.testing.assert_close(torch.tensor(cached), torch.tensor(live), rtol=2e-2, atol=0)
    info = (tmp_path / "cached-True" / "hidden_cache" / "cache_info.json").read_text()
    assert '"from_start": true' in info


def test_resume_continues_a_drafter_run(tiny_target, pattern_data, tmp_path):
    out = tmp_path / "out"
    train_heads.main(
        tiny_argv(tiny_target, pattern_data, out, drafter="sequential", max_steps=30, checkpoint_every=15)
    )
    resumed = train_heads.main(
        tiny_argv(tiny_target, pattern_data, out, drafter="sequential", max_steps=45, checkpoint_every=15)
        + ["--resume"]
    )
    assert resumed.summary["steps"] == 45 and [e["step"] for e in resumed.history if "train/loss" in e][0] == 40


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"drafter": "eagle"}, "drafter must be one of"),
        ({"feature_weight": 0.5}, "feature_weight regresses a sequential drafter"),
        ({"drafter": "sequential", "feature_weight": -1.0}, "feature_weight must be >= 0"),
        ({"feature_layers": [0, 1]}, "feature_layers chooses the target layers a sequential drafter reads"),
        ({"drafter": "sequential", "feature_layers": [1, 1]}, "feature_layers must be a non-empty list of distinct"),
        ({"drafter": "sequential", "feature_layers": [0, 3]}, "name hidden states the model does not have: it has 3"),
    ],
)
def test_bad_drafter_settings_are_refused(tiny_target, pattern_data, tmp_path, overrides, message):
    with pytest.raises(TrainingConfigError, match=message):
        train_heads.main(tiny_argv(tiny_target, pattern_data, tmp_path / "out", **overrides))


def test_teacher_features_are_the_targets_hidden_states_d_places_ahead():
    hidden = torch.arange(2 * 5, dtype=torch.float32).view(2, 5, 1).expand(2, 5, 3)  # value = 5 * batch + position
    batch_index, position = torch.tensor([0, 1, 1]), torch.tensor([0, 2, 3])
    teacher = states_ahead(hidden, batch_index, position, 2)
    assert teacher.shape == (3, 2, 3)
    expected = torch.tensor([[1.0, 2.0], [8.0, 9.0], [9.0, 9.0]])  # row (1, 3) at depth 2 is past the end: clamped
    torch.testing.assert_close(teacher[..., 0], expected)


def test_feature_regression_counts_only_depths_with_a_target():
    rows = torch.zeros(4, 2, 3)
    teacher = torch.zeros(4, 2, 3)
    valid = torch.tensor([[True, True], [True, True], [True, False], [True, False]])
    weights = torch.tensor([1.0, 0.5])
    assert feature_regression(rows, teacher, valid, weights) == 0
    teacher[2:, 1] = 100.0  # no target at depth 2 for these rows: they must not count
    assert feature_regression(rows, teacher, valid, weights) == 0
    teacher[0, 1] = 3.0  # smooth-L1 of 3 is 2.5; depth 2's mean over its 2 valid rows: 1.25, weighted 0.5
    assert feature_regression(rows, teacher, valid, weights).item() == pytest.approx(0.625)


def test_drafter_learns_from_the_targets_distribution_and_features_too(tiny_target, pattern_data, tmp_path):
    torch.set_num_threads(1)
    run = train_heads.main(
        tiny_argv(
            tiny_target,
            pattern_data,
            tmp_path / "out",
            drafter="sequential",
            learning_rate=3e-3,
            distill_weight=1.0,
            feature_weight=1.0,
        )
    )
    summary = run.summary
    assert summary["distill_weight"] == 1.0 and summary["feature_weight"] == 1.0
    assert summary["chain_top1_accuracy"][2] > 0.5
    kl = [sum(entry["train/head_kl"]) for entry in run.history if "train/head_kl" in entry]
    assert len(kl) >= 2 and kl[-1] < 0.5 * kl[0], f"the distillation term is logged and falls: {kl}"


def test_a_drafter_reading_several_layers_learns_and_caches_them_beside_the_final_state(
    tiny_target, pattern_data, tmp_path
):
    """EAGLE-3-style features through the whole pipeline: the cache holds the two named layers and, since the loss
    reads the target's final state ahead, that one too (3 x H per position); cached and live batches train alike;
    the saved drafter records its layers."""
    torch.set_num_threads(1)
    layers = dict(drafter="sequential", feature_layers=[0, 1], feature_weight=1.0, log_every=1)
    runs = {
        cached: train_heads.main(
            tiny_argv(
                tiny_target,
                pattern_data,
                tmp_path / f"cached-{cached}",
                max_steps=3,
                precompute_hidden=cached,
                **layers,
            )
        )
        for cached in (False, True)
    }
    live, cached = ([e["train/loss"] for e in runs[c].history if "train/loss" in e] for c in (False, True))
    torch.testing.assert_close(torch.tensor(cached), torch.tensor(live), rtol=2e-2, atol=0)
    info = json.loads((tmp_path / "cached-True" / "hidden_cache" / "cache_info.json").read_text())
    assert info["hidden_size"] == 3 * AutoModelForCausalLM.from_pretrained(tiny_target).config.hidden_size

    run = train_heads.main(tiny_argv(tiny_target, pattern_data, tmp_path / "full", learning_rate=3e-3, **layers))
    assert run.summary["chain_top1_accuracy"][2] > 0.5
    drafter = SequentialDrafter.from_pretrained(run.heads_dir)
    assert drafter.config.feature_layers == [0, 1] and drafter.reduce is not None
