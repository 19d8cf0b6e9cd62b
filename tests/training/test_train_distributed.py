"""Real launches (subprocesses): 2 CPU processes over gloo, DeepSpeed ZeRO-2/3, kill -9 + resume.

Also the Hub push from the command line against a loopback Hub. Slow (each launch imports
torch/transformers/deepspeed in every process); ~2 minutes in all on 2 cores once DeepSpeed's CPU communication
op is compiled (the first DeepSpeed launch on a machine compiles it, ~2-3 minutes, cached in
~/.cache/torch_extensions).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import training_fixtures
from safetensors.torch import load_file
from training_fixtures import REPO_ROOT, TRAIN_SCRIPT, subprocess_env, tiny_argv

from medusa_lite import MedusaHeads
from medusa_lite.commands import train as train_heads
from medusa_lite.training import checkpoint as ckpt
from medusa_lite.training.errors import OutputDirError

# pytest fixtures shared by the training tests (single_thread is autouse, for this module only)
tiny_target, pattern_data, single_thread = (
    training_fixtures.tiny_target,
    training_fixtures.pattern_data,
    training_fixtures.single_thread,
)

pytestmark = pytest.mark.slow

ACCELERATE = Path(sys.executable).parent / "accelerate"
LAUNCH_TIMEOUT_S = 600
RESUME_RUN = dict(max_steps=40, checkpoint_every=10)  # killed while writing step 20's checkpoint
DIGEST_LINE = re.compile(r"trainable weights sha256 per rank: \[([^\]]*)\]")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    launch_args: list[str], train_args: list[str], env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    env = {**subprocess_env(), **(env_extra or {})}
    command = [
        str(ACCELERATE),
        "launch",
        *launch_args,
        "--main_process_port",
        str(free_port()),
        str(TRAIN_SCRIPT),
        *train_args,
    ]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    assert done.returncode == 0, f"launch failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


def rank_digests(output: str) -> list[str]:
    match = DIGEST_LINE.search(output)
    assert match, "no weight digest line in the output"
    return [d.strip().strip("'") for d in match.group(1).split(",")]


def test_two_cpu_processes_train_one_synchronised_copy(tiny_target, pattern_data, tmp_path):
    out = tmp_path / "out"
    done = launch(
        [
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ],
        tiny_argv(tiny_target, pattern_data, out, max_steps=20, checkpoint_every=10),
        {"ACCELERATE_USE_CPU": "true"},
    )
    digests = rank_digests(done.stdout)
    # the ranks train on different samples (batch_indices), so equal weights prove the all-reduce
    assert len(digests) == 2 and digests[0] == digests[1]
    summary = MedusaHeads.from_pretrained(out / "heads").config.training_summary
    assert summary["num_processes"] == 2 and summary["ranks_in_sync"] and summary["steps"] == 20
    assert summary["top1_accuracy"][0] > 0.3


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_produces_loadable_heads(tiny_target, pattern_data, tmp_path, stage):
    out = tmp_path / "out"
    done = launch(
        ["--config_file", str(REPO_ROOT / "configs" / f"accelerate_deepspeed_zero{stage}.yaml")],
        tiny_argv(tiny_target, pattern_data, out, max_steps=20, checkpoint_every=10),
    )
    heads = MedusaHeads.from_pretrained(out / "heads")
    summary = heads.config.training_summary
    assert summary["num_processes"] == 2 and summary["steps"] == 20 and summary["top1_accuracy"][0] > 0.3
    if stage == 2:
        digests = rank_digests(done.stdout)
        assert len(digests) == 2 and digests[0] == digests[1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000010", "step-00000020"]


def wait_for_line(log: Path, text: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text() if log.exists() else ""):
        assert process.poll() is None, f"the run ended before printing {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s"
        time.sleep(0.05)


def run_to_the_end(argv: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def heads_tensors(folder: Path) -> dict:
    return load_file(folder / "heads" / "model.safetensors")


def test_kill_9_mid_checkpoint_write_then_resume_gives_the_uninterrupted_weights(tiny_target, pattern_data, tmp_path):
    """kill -9 while step 20's checkpoint is half written; --resume restarts from step 10 and ends
    with exactly the weights of a run that was never interrupted."""
    killed, uninterrupted = tmp_path / "killed", tmp_path / "uninterrupted"

    def argv(out: Path) -> list[str]:
        return [sys.executable, str(TRAIN_SCRIPT), *tiny_argv(tiny_target, pattern_data, out, **RESUME_RUN)]

    checkpoints = killed / "checkpoints"
    half_written = checkpoints / f"{ckpt.TEMP_PREFIX}{ckpt.step_dir_name(20)}"
    log = tmp_path / "killed.log"
    env = {**subprocess_env(), ckpt.DEBUG_STALL_ENV: f"20:{LAUNCH_TIMEOUT_S}"}
    with open(log, "w") as stderr:
        process = subprocess.Popen(argv(killed), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for_line(log, f"debug: stalling {LAUNCH_TIMEOUT_S} s in the middle of writing", process, 180)
            # The precondition: the kill lands inside the write of step 20 (state saved, no step file, no marker).
            assert sorted(p.name for p in half_written.iterdir()) and not ckpt.is_complete(half_written)
            assert not (half_written / ckpt.STATE_NAME).exists() and not (half_written / ckpt.COMPLETE_MARKER).exists()
            assert [step for step, _ in ckpt.complete_checkpoints(checkpoints)] == [10]
            # A second run into the folder while this one trains is refused, naming the holder.
            with pytest.raises(OutputDirError, match=f"in use by another training run \\(pid {process.pid},"):
                train_heads.main(tiny_argv(tiny_target, pattern_data, killed, **RESUME_RUN) + ["--resume"])
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == -signal.SIGKILL
    assert half_written.is_dir() and not (killed / "heads").exists(), "the killed run must have stopped mid-write"

    done = run_to_the_end(argv(killed) + ["--resume"])  # the dead run's lock went with it
    assert f"removed an incomplete checkpoint (interrupted write): {half_written}" in done.stdout
    assert re.search(r"resuming from \S+step-00000010 at step 10/40", done.stdout), done.stdout[-2000:]
    assert not half_written.exists()
    run_to_the_end(argv(uninterrupted))

    resumed, expected = heads_tensors(killed), heads_tensors(uninterrupted)
    assert resumed.keys() == expected.keys()
    different = [name for name in expected if not torch.equal(resumed[name], expected[name])]
    assert not different, f"the resumed run's weights differ from the uninterrupted run's: {different}"
    assert MedusaHeads.from_pretrained(killed / "heads").config.training_summary["steps"] == 40
    assert ckpt.read_state(checkpoints / ckpt.step_dir_name(40))["step"] == 40


def test_push_to_hub_uploads_the_trained_heads_byte_identical(tiny_target, pattern_data, tmp_path):
    from hub_server import HubServer

    out = tmp_path / "out"
    with HubServer() as hub:
        env = {k: v for k, v in subprocess_env().items() if not k.startswith("HF_") and "proxy" not in k.lower()}
        env.update(
            HF_ENDPOINT=hub.url,
            HF_TOKEN="hf_loopback_test_token",
            HF_HOME=str(tmp_path / "hf-home"),
            NO_PROXY="127.0.0.1,localhost",
        )
        argv = [
            sys.executable,
            str(TRAIN_SCRIPT),
            *tiny_argv(tiny_target, pattern_data, out, max_steps=5),
            "--push_to_hub",
            "test-user/tiny-heads",
        ]
        done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        files = hub.files("test-user/tiny-heads")
    for name in ("config.json", "model.safetensors"):
        assert files[name] == (out / "heads" / name).read_bytes()
    assert b"top-1" in files["README.md"] and b"tiny-target" in files["README.md"]
