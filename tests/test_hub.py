"""Pushing heads to the Hub, against a loopback server speaking the Hub's upload API.

No test here reaches the network: the Hub is ``tests/hub_server.py`` on 127.0.0.1, and every
socket connection to anything but loopback is refused while a push runs.

The main test pushes from a subprocess with ``HF_ENDPOINT`` set before ``huggingface_hub`` is
imported: the route a user takes, and independent of this pytest process, where other tests
imported ``huggingface_hub`` long ago with ``HF_HUB_OFFLINE=1`` (conftest). A second test
covers the ``endpoint=`` argument in-process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from medusa_lite import Datastore, DatastoreError, HeadsFileError, MedusaConfig, MedusaHeads
from medusa_lite.datastore import DATASTORE_FILE_NAME
from medusa_lite.hub import model_card, push_heads_to_hub
from hub_server import DEFAULT_USER, HubServer

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_loopback_test_token"
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
SUMMARY = {
    "data": "self-distilled: 64 Magpie-style prompts, 9,000 response tokens",
    "steps": 120,
    "topk_accuracy": [[0.4375, 0.0625, 0.03125], [0.28125, 0.046875, 0.015625]],
    "mean_accepted_tokens": 1.84375,
}

# Runs in a fresh interpreter whose environment points huggingface_hub at the loopback server.
PUSH_SCRIPT = r"""
import json, socket, sys

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
def guard(connect):
    def guarded(self, address):
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            raise OSError(f"test network guard: refused connection to {address!r}")
        return connect(self, address)
    return guarded
socket.socket.connect = guard(socket.socket.connect)
socket.socket.connect_ex = guard(socket.socket.connect_ex)

from medusa_lite import MedusaHeads
from medusa_lite.hub import push_heads_to_hub

folder = sys.argv[1]
urls = [
    push_heads_to_hub(MedusaHeads.from_pretrained(folder), "alice/tiny-heads", commit_message="Upload tiny heads"),
    push_heads_to_hub(folder, "tiny-heads-from-folder", revision="v1"),
]
print(json.dumps(urls))
"""


def tiny_heads() -> MedusaHeads:
    config = MedusaConfig(num_heads=2, hidden_size=8, vocab_size=16, num_layers=1, use_base_lm_head=False, base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct", training_summary=SUMMARY)
    heads = MedusaHeads(config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in heads.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return heads


@pytest.fixture
def saved_heads(tmp_path) -> tuple[MedusaHeads, Path]:
    heads = tiny_heads()
    folder = tmp_path / "local"
    heads.save_pretrained(folder)
    return heads, folder


def loopback_env(hub: HubServer, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k not in ("TRANSFORMERS_OFFLINE",) and "proxy" not in k.lower()}
    env.update(HF_ENDPOINT=hub.url, HF_TOKEN=TOKEN, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost,::1", PYTHONPATH=str(ROOT))
    return env


def assert_pushed(hub: HubServer, repo_id: str, folder: Path, revision: str = "main", extra: tuple[str, ...] = ()) -> dict[str, bytes]:
    files = hub.files(repo_id, revision)
    assert sorted(files) == sorted(["README.md", "config.json", "model.safetensors", *extra])
    for name in ("config.json", "model.safetensors", *extra):
        assert files[name] == (folder / name).read_bytes(), f"{name} changed on the way to the Hub"
    return files


@pytest.mark.slow
def test_push_is_byte_identical_and_loads_back(saved_heads, tmp_path):
    heads, folder = saved_heads
    with HubServer() as hub:
        result = subprocess.run(
            [sys.executable, "-c", PUSH_SCRIPT, str(folder)],
            cwd=ROOT, env=loopback_env(hub, tmp_path / "hf-home"), capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, result.stderr
        urls = json.loads(result.stdout.strip().splitlines()[-1])

        assert hub.unexpected == []
        assert hub.authorizations == {f"Bearer {TOKEN}"}
        assert all(url.startswith(hub.url) for url in urls)
        assert urls[0] == f"{hub.url}/alice/tiny-heads/commit/{hub.repos['alice/tiny-heads'].commits[0].oid}"
        assert hub.repos["alice/tiny-heads"].commits[0].summary == "Upload tiny heads"
        assert not hub.repos["alice/tiny-heads"].private

        # From a module (saved to a temp dir by push_heads_to_hub) and from the saved folder.
        files = assert_pushed(hub, "alice/tiny-heads", folder)
        from_folder = assert_pushed(hub, f"{DEFAULT_USER}/tiny-heads-from-folder", folder, revision="v1")
        assert hub.files(f"{DEFAULT_USER}/tiny-heads-from-folder", "main") == {}

    card = files["README.md"].decode()
    assert card == model_card(heads.config, repo_id="alice/tiny-heads")
    assert from_folder["README.md"].decode() == model_card(heads.config, repo_id=f"{DEFAULT_USER}/tiny-heads-from-folder")
    metadata = yaml.safe_load(card.split("---")[1])
    assert metadata["library_name"] == "medusa-lite"
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "medusa" in metadata["tags"]
    assert SUMMARY["data"] in card and "120" in card and "1.844" in card
    for accuracy in ("0.438", "0.062", "0.031", "0.281", "0.047", "0.016", "0.531", "0.344"):
        assert accuracy in card
    assert 'MedusaHeads.from_pretrained("alice/tiny-heads")' in card

    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    for name, data in files.items():
        (rebuilt / name).write_bytes(data)
    loaded = MedusaHeads.from_pretrained(rebuilt)
    assert loaded.config == heads.config
    expected = heads.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_push_with_endpoint_argument(saved_heads, monkeypatch):
    """In-process: ``endpoint=`` reaches the loopback server even though HF_ENDPOINT is unset."""
    import huggingface_hub.constants

    heads, folder = saved_heads
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # conftest sets offline mode
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,::1")
    connect = socket.socket.connect

    def guarded(self, address):
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            raise OSError(f"test network guard: refused connection to {address!r}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    with HubServer() as hub:
        url = push_heads_to_hub(heads, "bob/heads", endpoint=hub.url, token=TOKEN, private=True)
        assert hub.unexpected == []
        assert url.startswith(f"{hub.url}/bob/heads/commit/")
        assert hub.repos["bob/heads"].private
        assert_pushed(hub, "bob/heads", folder)
        # Pushing again to the existing repo is a second commit, not an error.
        push_heads_to_hub(folder, "bob/heads", endpoint=hub.url, token=TOKEN)
        assert len(hub.repos["bob/heads"].commits) == 2
        # A folder's datastore travels with its heads.
        Datastore.from_documents([torch.tensor([1, 2, 3])], heads.config.vocab_size).save(folder / DATASTORE_FILE_NAME)
        push_heads_to_hub(folder, "bob/heads-with-datastore", endpoint=hub.url, token=TOKEN)
        files = assert_pushed(hub, "bob/heads-with-datastore", folder, extra=(DATASTORE_FILE_NAME,))
        assert "## Datastore" in files["README.md"].decode() and "3 tokens of 1 answers" in files["README.md"].decode()


@pytest.mark.parametrize("missing", ["model.safetensors", "config.json"])
def test_folder_missing_a_file_is_a_clear_error(saved_heads, missing):
    _, folder = saved_heads
    (folder / missing).unlink()
    with pytest.raises(HeadsFileError, match=rf"missing {missing}.*MedusaHeads.save_pretrained"):
        push_heads_to_hub(folder, "alice/heads", endpoint="http://127.0.0.1:9", token=TOKEN)


def test_unloadable_folder_is_refused_before_any_upload(saved_heads, tmp_path):
    _, folder = saved_heads
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(HeadsFileError, match="could not be read as safetensors"):
        push_heads_to_hub(folder, "alice/heads", endpoint="http://127.0.0.1:9", token=TOKEN)
    (folder / "model.safetensors").unlink()
    saved_heads[0].save_pretrained(folder)
    Datastore.from_documents([torch.tensor([1, 2, 3])], 50).save(folder / DATASTORE_FILE_NAME)
    with pytest.raises(DatastoreError, match="vocabulary of 50 ids, the model has 16"):
        push_heads_to_hub(folder, "alice/heads", endpoint="http://127.0.0.1:9", token=TOKEN)
    with pytest.raises(HeadsFileError, match="no such folder"):
        push_heads_to_hub(tmp_path / "nowhere", "alice/heads", endpoint="http://127.0.0.1:9", token=TOKEN)


def test_card_renders_only_what_was_recorded():
    bare = model_card(MedusaConfig(num_heads=3, hidden_size=8, vocab_size=16, base_model_name_or_path="/models/my-llm"))
    metadata = yaml.safe_load(bare.split("---")[1])
    assert "base_model" not in metadata  # a local path is not a Hub model id
    assert "/models/my-llm" in bare
    assert "No training details were recorded" in bare
    assert "accuracy" not in bare.lower() and "| rank" not in bare

    top1_only = model_card(MedusaConfig(num_heads=2, hidden_size=8, vocab_size=16, training_summary={"top1_accuracy": [0.5, 0.25]}))
    assert "| head | guesses token | top-1 |" in top1_only and "0.500" in top1_only and "0.250" in top1_only
    assert "rank 1" not in top1_only and "Mean accepted" not in top1_only and "Steps" not in top1_only
