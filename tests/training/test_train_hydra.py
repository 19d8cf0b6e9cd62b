"""Hydra-style heads trained end to end through ``train/train_heads.py`` (``--drafter hydra``) on a tiny model."""

from __future__ import annotations

import pytest
import torch
import training_fixtures
from tiny_models import plain_greedy
from tiny_tokenizer import TINY_VOCAB_SIZE
from training_fixtures import tiny_argv
from transformers import AutoModelForCausalLM

from medusa_lite import DynamicTree, generate, load
from medusa_lite.commands import train as train_heads
from medusa_lite.drafters.hydra.heads import HYDRA_KIND, HydraHeads
from medusa_lite.drafters.hydra.proposer import HydraProposer
from medusa_lite.training import TrainingConfigError
from medusa_lite.training.losses import gather_rows

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
            tiny_target, pattern_data, tmp_path_factory.mktemp("run") / "out", drafter="hydra", learning_rate=3e-3
        )
    )


def test_hydra_heads_learn_every_depth_on_held_out_data(trained):
    summary = trained.summary
    assert summary["drafter"] == "hydra"
    top1 = summary["top1_accuracy"]
    assert len(top1) == 3 and min(top1) > 0.5, f"held-out top-1 per depth {top1} (chance {CHANCE:.2g})"
    chain = summary["chain_top1_accuracy"]  # right at every depth so far (chance: CHANCE ** depth)
    assert len(chain) == 3 and chain[0] == top1[0] and chain[2] > 0.5, chain
    losses = [entry["train/loss"] for entry in trained.history if "train/loss" in entry]
    assert losses[-1] < 0.5 * losses[0]


def test_saved_hydra_heads_load_strictly_and_decode_exactly(trained, tiny_target):
    heads = HydraHeads.from_pretrained(trained.heads_dir)
    assert heads.config.kind == HYDRA_KIND and heads.config.num_heads == 3
    assert heads.config.training_summary["top1_accuracy"] == trained.summary["top1_accuracy"]
    model, _ = load(tiny_target, heads=trained.heads_dir, tree=DynamicTree(8, (1.0,) * 12), datastore=False)
    assert any(isinstance(p, HydraProposer) for p in model.proposers)
    base = AutoModelForCausalLM.from_pretrained(tiny_target).eval()
    prompt = torch.tensor([[1, 5, 9, 13, 17]])
    out = generate(model, prompt, 24, eos_token_id=[])
    assert torch.equal(out.sequences, plain_greedy(base, prompt, 24, eos_token_id=None))


def test_cached_hidden_states_train_as_live_forwards_do(tiny_target, pattern_data, tmp_path):
    runs = {}
    for cached in (False, True):
        argv = tiny_argv(
            tiny_target,
            pattern_data,
            tmp_path / f"cached-{cached}",
            drafter="hydra",
            max_steps=3,
            log_every=1,
            precompute_hidden=cached,
        )
        runs[cached] = train_heads.main(argv)
    live, cached = ([e["train/loss"] for e in runs[c].history if "train/loss" in e] for c in (False, True))
    assert len(live) == len(cached) == 3
    torch.testing.assert_close(torch.tensor(cached), torch.tensor(live), rtol=2e-2, atol=0)


def test_rows_carry_the_tokens_each_head_reads():
    """Head k at position n reads tokens n+1 .. n+k: the rows hold them, clamped at the sequence's end."""
    input_ids = torch.tensor([[10, 11, 12, 13, 14, 15]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    rows = gather_rows(torch.randn(1, 6, 4), input_ids, loss_mask, num_heads=3, with_teacher=False)
    by_position = {int(row[0]) - 11: row.tolist() for row in rows.path_tokens}  # token n+1 is 11 + n
    assert sorted(by_position) == [0, 1, 2, 3]  # position 4 has no target 2 or more tokens ahead
    assert by_position[0] == [11, 12, 13] and by_position[2] == [13, 14, 15] and by_position[3] == [14, 15, 15]


def test_hydra_heads_refuse_lora(tiny_target, pattern_data, tmp_path):
    with pytest.raises(TrainingConfigError, match="drafter: hydra cannot be combined with lora"):
        train_heads.main(tiny_argv(tiny_target, pattern_data, tmp_path / "out", drafter="hydra", lora="{r: 4}"))
