"""Head training end to end through ``train/train_heads.py`` on a tiny random model."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import training_fixtures
from tiny_tokenizer import TINY_VOCAB_SIZE
from training_fixtures import (
    REPO_ROOT,
    TRAIN_SCRIPT,
    subprocess_env,
    tiny_argv,
    write_distinct_pattern_data,
    write_pattern_data,
)
from transformers import AutoModelForCausalLM

import medusa_lite.artifacts.hub
from medusa_lite import MedusaHeads, MedusaModel, load
from medusa_lite.commands import train as train_heads
from medusa_lite.training import load_trained, trainer
from medusa_lite.training.data import TokenizedData, load_training_data

# pytest fixtures shared by the training tests (single_thread is autouse, for this module only)
tiny_target, pattern_data, single_thread = (
    training_fixtures.tiny_target,
    training_fixtures.pattern_data,
    training_fixtures.single_thread,
)

CHANCE = 1 / TINY_VOCAB_SIZE


@dataclass
class TrainedRun:
    result: object  # train_heads.main's TrainResult
    data: TokenizedData  # the run's own train / held-out split


@pytest.fixture(scope="module")
def trained(tiny_target, tmp_path_factory) -> TrainedRun:
    """A 60-step run on distinct records; the split it made is captured (the loader still runs) to check it."""
    torch.set_num_threads(1)
    data = write_distinct_pattern_data(tmp_path_factory.mktemp("distinct-data") / "train.jsonl")
    splits = []

    def recorded_load(*args, **kwargs):
        splits.append(load_training_data(*args, **kwargs))
        return splits[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainer, "load_training_data", recorded_load)
        result = train_heads.main(tiny_argv(tiny_target, data, tmp_path_factory.mktemp("run") / "out"))
    assert len(splits) == 1
    return TrainedRun(result, splits[0])


def test_held_out_sequences_are_disjoint_from_the_training_sequences(trained):
    train = [tuple(sample.input_ids.tolist()) for sample in trained.data.train]
    held_out = [tuple(sample.input_ids.tolist()) for sample in trained.data.eval]
    assert len(held_out) == trained.result.summary["eval_sequences"] > 0
    copies = [seq for seq in held_out if any(seq == other[: len(seq)] for other in train)]
    assert not copies, f"{len(copies)} of {len(held_out)} held-out sequences are (prefixes of) training sequences"


def test_head_accuracy_rises_far_above_chance_on_held_out_data(trained):
    summary = trained.result.summary
    top1 = summary["top1_accuracy"]
    assert len(top1) == 3
    assert top1[0] > 0.5, f"head-1 held-out top-1 accuracy {top1[0]} (chance {CHANCE:.4f})"
    assert all(a > 50 * CHANCE for a in top1)
    losses = [entry["train/loss"] for entry in trained.result.history if "train/loss" in entry]
    assert losses[-1] < 0.8 * losses[0]


def test_saved_heads_load_strictly_and_carry_the_training_summary(trained, tiny_target):
    heads = MedusaHeads.from_pretrained(trained.result.heads_dir)
    summary = heads.config.training_summary
    assert summary["steps"] == 60 and summary["tokens_trained"] > 0
    ranks = summary["topk_accuracy"]  # what the tree calibration reads: [head][rank]
    assert len(ranks) == 3 and all(len(row) == 5 for row in ranks)
    for row, top1, top5 in zip(ranks, summary["top1_accuracy"], summary["top5_accuracy"]):
        assert row[0] == pytest.approx(top1) and sum(row) == pytest.approx(top5, abs=1e-3) and sum(row) <= 1.0 + 1e-6
    assert summary["data"].endswith("train.jsonl") and summary["eval_sequences"] == len(trained.data.eval) == 8
    base = AutoModelForCausalLM.from_pretrained(tiny_target)
    MedusaModel(base, heads)  # sizes fit the target
    assert heads.config.base_model_name_or_path == str(tiny_target)


def test_checkpoints_and_metrics_are_written(trained):
    checkpoints = sorted(p.name for p in (trained.result.output_dir / "checkpoints").iterdir())
    assert checkpoints == ["step-00000030", "step-00000060"]
    lines = (trained.result.output_dir / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["step"] == 10 and "train/head_top1" in json.loads(lines[0])


def test_cached_hidden_states_give_the_same_losses_as_live_forwards(tiny_target, pattern_data, tmp_path):
    runs = {}
    for cached in (False, True):
        argv = tiny_argv(
            tiny_target,
            pattern_data,
            tmp_path / f"cached-{cached}",
            max_steps=4,
            log_every=1,
            precompute_hidden=cached,
            distill_weight=0.5,
        )
        runs[cached] = train_heads.main(argv)
    live, cached = ([e["train/loss"] for e in runs[c].history if "train/loss" in e] for c in (False, True))
    assert len(live) == len(cached) == 4
    torch.testing.assert_close(torch.tensor(cached), torch.tensor(live), rtol=2e-2, atol=0)
    assert (tmp_path / "cached-True" / "hidden_cache" / "cache_info.json").is_file()
    assert runs[True].summary["top1_accuracy"] == pytest.approx(runs[False].summary["top1_accuracy"], abs=0.05)


def test_distillation_adds_a_nonnegative_kl_term(tiny_target, pattern_data, tmp_path):
    first_loss = {}
    for weight in (0.0, 1.0):
        result = train_heads.main(
            tiny_argv(
                tiny_target, pattern_data, tmp_path / f"kl-{weight}", max_steps=1, log_every=1, distill_weight=weight
            )
        )
        first_loss[weight] = result.history[0]["train/loss"]
    assert first_loss[1.0] > first_loss[0.0]  # same weights at step 1: CE + KL > CE


def test_messages_records_train_like_sharegpt(tiny_target, tmp_path):
    data = write_pattern_data(tmp_path / "messages.jsonl", 40, style="messages")
    result = train_heads.main(tiny_argv(tiny_target, data, tmp_path / "out", max_steps=2))
    assert result.summary["train_sequences"] == 32 and result.summary["tokens_trained"] > 0


def test_medusa2_trains_a_lora_adapter_with_the_heads_and_loads_back(tiny_target, pattern_data, tmp_path):
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"], "distill_weight": 1.0}
    result = train_heads.main(
        tiny_argv(tiny_target, pattern_data, tmp_path / "out", max_steps=4, log_every=2, lora=lora, learning_rate=0.05)
    )
    assert (
        result.adapter_dir == result.heads_dir / "adapter" and (result.adapter_dir / "adapter_config.json").is_file()
    )
    assert MedusaHeads.from_pretrained(result.heads_dir).config.backbone_adapter
    assert result.summary["medusa2_lora"]["r"] == 4
    assert all("train/base_kl" in e for e in result.history if "train/loss" in e)
    base = AutoModelForCausalLM.from_pretrained(tiny_target)
    reference = AutoModelForCausalLM.from_pretrained(tiny_target)
    model = load_trained(result.output_dir, base)
    ids = torch.randint(0, TINY_VOCAB_SIZE, (1, 12))
    adapted_logits = model.target_forward(ids).logits
    assert not torch.allclose(adapted_logits, reference(ids).logits), "the merged adapter should change the target"
    assert model.head_logits(model.target_forward(ids).hidden).shape == (1, 12, 3, TINY_VOCAB_SIZE)
    loaded, _ = load(tiny_target, heads=result.heads_dir, prepack=False)  # the artifact alone gives the adapted target
    torch.testing.assert_close(loaded.target_forward(ids).logits, adapted_logits)


def test_wandb_offline_logs_without_key_or_network(tiny_target, pattern_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    result = train_heads.main(
        tiny_argv(
            tiny_target,
            pattern_data,
            tmp_path / "out",
            max_steps=2,
            log_every=1,
            wandb={"project": "medusa-lite-test"},
        )
    )
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert runs and result.summary["steps"] == 2


def test_push_to_hub_is_called_and_a_failure_keeps_the_heads(tiny_target, pattern_data, tmp_path, monkeypatch):
    calls = []

    def fake_push(folder, repo_id, token=None, private=False):
        calls.append((folder, repo_id))
        return "http://hub/commit/1"

    monkeypatch.setattr(medusa_lite.artifacts.hub, "push_heads_to_hub", fake_push)
    result = train_heads.main(
        tiny_argv(tiny_target, pattern_data, tmp_path / "ok", max_steps=1) + ["--push_to_hub", "me/heads"]
    )
    assert calls == [(str(result.heads_dir), "me/heads")] and result.push_error is None

    def failing_push(folder, repo_id, token=None, private=False):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(medusa_lite.artifacts.hub, "push_heads_to_hub", failing_push)
    result = train_heads.main(
        tiny_argv(tiny_target, pattern_data, tmp_path / "fail", max_steps=1) + ["--push_to_hub", "me/heads"]
    )
    assert "no route to host" in result.push_error and str(result.heads_dir) in result.push_error
    MedusaHeads.from_pretrained(result.heads_dir)


def test_accelerate_launch_one_process(tiny_target, pattern_data, tmp_path):
    accelerate = Path(sys.executable).parent / "accelerate"
    out = tmp_path / "out"
    command = [
        str(accelerate),
        "launch",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(TRAIN_SCRIPT),
    ]
    command += tiny_argv(tiny_target, pattern_data, out, max_steps=20)
    done = subprocess.run(command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    heads = MedusaHeads.from_pretrained(out / "heads")
    assert heads.config.training_summary["num_processes"] == 1 and heads.config.training_summary["steps"] == 20
