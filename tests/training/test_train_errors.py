"""Issue 5, training side: bad data, bad configs, faults mid-run. Each test asserts the exception
type and a message naming the problem (or the documented behaviour)."""

from __future__ import annotations

import os
import shutil
import sys
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch
import training_fixtures
from hostile_files import pickle_bytes
from safetensors.torch import load_file
from training_fixtures import TINY_CONFIG, TRAIN_SCRIPT, pattern_answer, save_tiny_target, tiny_argv, write_records

import medusa_lite.training.checks as checks
from medusa_lite import MedusaHeads
from medusa_lite.commands import train as train_heads
from medusa_lite.errors import MedusaError
from medusa_lite.training.errors import (
    CheckpointError,
    EmptyDatasetError,
    HiddenCacheError,
    MissingChatTemplateError,
    NoAssistantTurnError,
    NonFiniteLossError,
    OutputDirError,
    TrackerError,
    TrainingConfigError,
    TrainingDataError,
)

# pytest fixtures shared by the training tests (single_thread is autouse, for this module only)
tiny_target, pattern_data, single_thread = (
    training_fixtures.tiny_target,
    training_fixtures.pattern_data,
    training_fixtures.single_thread,
)

GOOD = {
    "conversations": [
        {"from": "human", "value": "Go on."},
        {"from": "gpt", "value": "the and of is a to in sun water air the and"},
    ]
}
NO_ASSISTANT = {"conversations": [{"from": "human", "value": "Hello?"}, {"from": "human", "value": "Anyone?"}]}


def run(tiny_target, data, output_dir, **overrides):
    return train_heads.main(tiny_argv(tiny_target, data, output_dir, **overrides))


# -- data -------------------------------------------------------------------------------------


def test_empty_data_file(tiny_target, tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    with pytest.raises(EmptyDatasetError, match=r"empty\.jsonl is empty: no records"):
        run(tiny_target, data, tmp_path / "out")


def test_records_that_are_all_unusable(tiny_target, tmp_path):
    data = write_records(tmp_path / "bad.jsonl", [{"conversations": []}] * 3)
    with pytest.raises(EmptyDatasetError, match=r"no usable sequence among 3 records.*3 \(malformed conversation\)"):
        run(tiny_target, data, tmp_path / "out")


def test_missing_data_file(tiny_target, tmp_path):
    with pytest.raises(TrainingDataError, match=r"nope\.jsonl does not exist"):
        run(tiny_target, tmp_path / "nope.jsonl", tmp_path / "out")


def test_no_conversation_has_an_assistant_turn(tiny_target, tmp_path):
    data = write_records(tmp_path / "users.jsonl", [NO_ASSISTANT] * 4)
    with pytest.raises(NoAssistantTurnError, match=r"none of its 4 conversations has an assistant turn"):
        run(tiny_target, data, tmp_path / "out")


def test_conversations_without_assistant_turn_are_skipped_and_counted(tiny_target, tmp_path, capsys):
    data = write_records(tmp_path / "mixed.jsonl", [GOOD] * 10 + [NO_ASSISTANT] * 3)
    result = run(tiny_target, data, tmp_path / "out", max_steps=1, batch_size=4)
    assert result.summary["skipped_records"] == {"no assistant turn": 3}
    assert "skipped: 3 (no assistant turn)" in capsys.readouterr().out


def test_too_long_samples_are_truncated_and_counted(tiny_target, pattern_data, tmp_path, capsys):
    result = run(tiny_target, pattern_data, tmp_path / "out", max_length=70, max_steps=1)
    assert result.summary["truncated_sequences"] == 80
    assert "80 sequence(s) were longer than max_length=70 and were truncated" in capsys.readouterr().out


def test_tokenizer_without_chat_template(tmp_path):
    target = save_tiny_target(tmp_path / "no-template", chat_template=False)
    data = write_records(tmp_path / "chat.jsonl", [GOOD] * 4)
    with pytest.raises(MissingChatTemplateError, match=r"tokenizer .*no-template.* has no chat template.*plain text"):
        run(target, data, tmp_path / "out")


def test_plain_text_needs_no_chat_template(tmp_path):
    target = save_tiny_target(tmp_path / "no-template", chat_template=False)
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(pattern_answer(__import__("random").Random(i), 40) for i in range(20)))
    result = run(target, text, tmp_path / "out", max_steps=2, max_length=32, batch_size=2)
    assert result.summary["tokens_trained"] > 0 and result.summary["train_sequences"] >= 4


def test_fewer_sequences_than_one_batch(tiny_target, tmp_path):
    data = write_records(tmp_path / "few.jsonl", [GOOD] * 3)
    with pytest.raises(
        TrainingDataError, match=r"2 training sequences are fewer than one step's batch_size x processes = 8 x 1"
    ):
        run(tiny_target, data, tmp_path / "out")


# -- config -----------------------------------------------------------------------------------


def test_typo_in_the_yaml_config(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text(TINY_CONFIG.read_text() + "learnig_rate: 0.1\n")
    with pytest.raises(
        TrainingConfigError, match=r"unknown config key\(s\) learnig_rate; known keys: .*learning_rate"
    ):
        train_heads.main(["--config", str(config)])


def test_typo_on_the_command_line(tiny_target, pattern_data, tmp_path):
    with pytest.raises(TrainingConfigError, match=r"unknown config key\(s\) epoch; known keys: .*epochs"):
        train_heads.main(tiny_argv(tiny_target, pattern_data, tmp_path / "out") + ["--epoch", "3"])


def test_processes_that_accelerate_does_not_synchronise_are_refused():
    from accelerate.utils import DistributedType

    fake = SimpleNamespace(num_processes=2, distributed_type=DistributedType.NO)
    with pytest.raises(
        TrainingConfigError, match=r"2 processes but does not synchronise them.*ACCELERATE_USE_CPU=true"
    ):
        checks.check_processes_connected(fake)


def test_wandb_online_without_a_key_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    argv = tiny_argv(tmp_path / "no-model", tmp_path / "no-data.jsonl", tmp_path / "out", wandb={"project": "p"})
    with pytest.raises(TrackerError, match=r"no API key was found.*WANDB_MODE=offline"):
        train_heads.main(argv)


# -- output folder ----------------------------------------------------------------------------


def test_unwritable_output_dir_is_detected_before_loading_anything(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    argv = tiny_argv(tmp_path / "no-model", tmp_path / "no-data.jsonl", blocker / "out")
    with pytest.raises(OutputDirError, match=r"a-file/out is not writable"):
        train_heads.main(argv)


def test_too_little_free_space_is_detected_before_training(tiny_target, pattern_data, tmp_path, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checks.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(OutputDirError, match=r"has 1e-06 GB free but training will write about"):
        run(tiny_target, pattern_data, tmp_path / "out")
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_a_fresh_start_does_not_clobber_a_previous_run(tiny_target, pattern_data, tmp_path):
    run(tiny_target, pattern_data, tmp_path / "out", max_steps=1)
    with pytest.raises(OutputDirError, match=r"already holds a training run.*--resume"):
        run(tiny_target, pattern_data, tmp_path / "out", max_steps=1)


def test_hidden_cache_larger_than_the_limit_is_refused(tiny_target, pattern_data, tmp_path):
    with pytest.raises(HiddenCacheError, match=r"would take 0.000\d+ GB \(> max_cache_gb = 1e-06\)"):
        run(tiny_target, pattern_data, tmp_path / "out", precompute_hidden=True, max_cache_gb=1e-6)


# -- faults during training -------------------------------------------------------------------


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tiny_target, pattern_data, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(
        NonFiniteLossError,
        match=r"loss is nan \(not finite\) at step 45 .*last good checkpoint is .*step-00000030 \(step 30\)",
    ):
        run(tiny_target, pattern_data, out, debug_nan_at_step=45)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000030"]
    weights = load_file(out / "checkpoints" / "step-00000030" / "model.safetensors")
    assert weights and all(torch.isfinite(w).all() for w in weights.values())
    assert not (out / "heads").exists()
    assert isinstance(NonFiniteLossError("x"), MedusaError)
    result = train_heads.main(tiny_argv(tiny_target, pattern_data, out) + ["--resume"])
    assert result.summary["steps"] == 60


def test_half_written_checkpoints_are_ignored_on_resume(tiny_target, pattern_data, tmp_path, capsys):
    reference = run(tiny_target, pattern_data, tmp_path / "reference", max_steps=60, checkpoint_every=10)
    out = tmp_path / "out"
    run(tiny_target, pattern_data, out, max_steps=30, checkpoint_every=10)
    checkpoints = out / "checkpoints"
    # a kill during a write leaves a temp folder (here with a truncated weights file) ...
    shutil.copytree(checkpoints / "step-00000030", checkpoints / ".tmp-step-00000040")
    weights = checkpoints / ".tmp-step-00000040" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    # ... and a step folder without its COMPLETE marker must not count either
    shutil.copytree(checkpoints / "step-00000030", checkpoints / "step-00000050")
    (checkpoints / "step-00000050" / "COMPLETE").unlink()
    shutil.rmtree(out / "heads")
    capsys.readouterr()
    resumed = train_heads.main(
        tiny_argv(tiny_target, pattern_data, out, max_steps=60, checkpoint_every=10) + ["--resume"]
    )
    log = capsys.readouterr().out
    assert (
        "ignored and removed an incomplete checkpoint (interrupted write)" in log
        and ".tmp-step-00000040" in log
        and "step-00000050" in log
    )
    assert "resuming from" in log and "step-00000030 at step 30/60" in log
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "step-00000050",
        "step-00000060",
    ]  # rewritten complete; keep 2
    assert resumed.summary["steps"] == 60 and resumed.summary["tokens_trained"] == reference.summary["tokens_trained"]
    final, expected = MedusaHeads.from_pretrained(resumed.heads_dir), MedusaHeads.from_pretrained(reference.heads_dir)
    for (name, a), (_, b) in zip(final.state_dict().items(), expected.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=f"{name} differs from an uninterrupted run")


def test_resume_never_unpickles_a_checkpoint_file(tiny_target, pattern_data, tmp_path):
    out = tmp_path / "out"
    run(tiny_target, pattern_data, out, max_steps=20, checkpoint_every=10)
    checkpoint = out / "checkpoints" / "step-00000020"
    assert not list(checkpoint.glob("custom_checkpoint_*")), "the schedule is replayed, not pickled"
    marker = tmp_path / "pickle-ran"
    (checkpoint / "custom_checkpoint_0.pkl").write_bytes(pickle_bytes(marker))  # what accelerate would unpickle
    shutil.rmtree(out / "heads")
    argv = tiny_argv(tiny_target, pattern_data, out, max_steps=30, checkpoint_every=10) + ["--resume"]
    with pytest.raises(CheckpointError, match="custom_checkpoint_0.pkl: pickles that resuming would run"):
        train_heads.main(argv)
    assert not marker.exists(), "resuming unpickled a file of the checkpoint"
    (checkpoint / "custom_checkpoint_0.pkl").unlink()  # what the message says to do with an old checkpoint
    assert train_heads.main(argv).summary["steps"] == 30


def test_a_second_run_into_an_output_dir_in_use_is_refused_until_the_first_ends(tiny_target, pattern_data, tmp_path):
    """The run lock: held (as a training run's main process holds it), a fresh start and a --resume into the folder
    are both refused with the holder named; released, the run goes ahead. (A real second process, killed with -9:
    tests/training/test_train_distributed.py.)"""
    out = tmp_path / "out"
    out.mkdir()
    held, problem = checks.take_run_lock(out)
    assert problem is None
    try:
        for extra in ([], ["--resume"]):
            with pytest.raises(OutputDirError, match=rf"in use by another training run \(pid {os.getpid()},"):
                train_heads.main(tiny_argv(tiny_target, pattern_data, out, max_steps=2) + extra)
        assert not (out / "checkpoints").exists(), "a refused run wrote into the folder"
    finally:
        held.close()
    assert train_heads.main(tiny_argv(tiny_target, pattern_data, out, max_steps=2)).summary["steps"] == 2
    again, problem = checks.take_run_lock(out)  # the finished run let go of it
    assert problem is None
    again.close()


def test_resume_without_any_checkpoint_starts_from_zero(tiny_target, pattern_data, tmp_path, capsys):
    result = train_heads.main(tiny_argv(tiny_target, pattern_data, tmp_path / "out", max_steps=2) + ["--resume"])
    assert "no complete checkpoint" in capsys.readouterr().out and result.summary["steps"] == 2


def test_cli_prints_a_clear_error_and_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train_heads.py", "--config", str(tmp_path / "missing.yaml")])
    import runpy

    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(TRAIN_SCRIPT), run_name="__main__")
    assert exit_info.value.code == 2
    assert "error: config file" in capsys.readouterr().err
