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
from artifact_fixtures import adapted_reference, plain_target, save_medusa2_artifact
from hub_server import DEFAULT_USER, HubServer

from medusa_lite import Datastore, DatastoreError, HeadsFileError, MedusaConfig, MedusaHeads
from medusa_lite.artifacts.custom_generate import custom_generate_files
from medusa_lite.artifacts.files import ADAPTER_FILES
from medusa_lite.artifacts.hub import push_heads_to_hub
from medusa_lite.artifacts.loading import write_tree_file
from medusa_lite.drafters.medusa.card import model_card
from medusa_lite.errors import AdapterError
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME
from medusa_lite.trees.tree import Tree

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_loopback_test_token"
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
SUMMARY = {
    "data": "self-distilled: 64 Magpie-style prompts, 9,000 response tokens",
    "steps": 120,
    "topk_accuracy": [[0.4375, 0.0625, 0.03125], [0.28125, 0.046875, 0.015625]],
    "mean_accepted_tokens": 1.84375,
}

# Refuses, in a subprocess, every socket connection to anything but loopback.
NETWORK_GUARD = r"""
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
"""

TREE = [[0], [1], [0, 0], [0, 0, 0]]
TREE_V1 = [[0], [1], [2]]
ROUND_TRIP_PROMPT = [5, 17, 40, 9, 33, 12]
ROUND_TRIP_TOKENS = 24

# Runs in a fresh interpreter whose environment points huggingface_hub at the loopback server.
PUSH_SCRIPT = (
    NETWORK_GUARD
    + r"""
from medusa_lite import MedusaHeads
from medusa_lite.artifacts.hub import push_heads_to_hub

folder = sys.argv[1]
urls = [
    push_heads_to_hub(MedusaHeads.from_pretrained(folder), "alice/tiny-heads", commit_message="Upload tiny heads"),
    push_heads_to_hub(folder, "tiny-heads-from-folder", revision="v1"),
]
print(json.dumps(urls))
"""
)


def tiny_heads() -> MedusaHeads:
    config = MedusaConfig(
        num_heads=2,
        hidden_size=8,
        vocab_size=16,
        num_layers=1,
        use_base_lm_head=False,
        base_model_name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
        training_summary=SUMMARY,
    )
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
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HF_") and k not in ("TRANSFORMERS_OFFLINE",) and "proxy" not in k.lower()
    }
    env.update(
        HF_ENDPOINT=hub.url,
        HF_TOKEN=TOKEN,
        HF_HOME=str(home),
        HF_HUB_DISABLE_TELEMETRY="1",
        NO_PROXY="127.0.0.1,localhost,::1",
        PYTHONPATH=str(ROOT),
    )
    return env


def assert_pushed(
    hub: HubServer, repo_id: str, folder: Path, revision: str = "main", extra: tuple[str, ...] = ()
) -> dict[str, bytes]:
    files = hub.files(repo_id, revision)
    generated = custom_generate_files(repo_id)
    assert sorted(files) == sorted(["README.md", "config.json", "model.safetensors", *extra, *generated])
    for name in ("config.json", "model.safetensors", *extra):
        assert files[name] == (folder / name).read_bytes(), f"{name} changed on the way to the Hub"
    for name, text in generated.items():
        assert files[name].decode() == text
    # transformers' generate(custom_generate=repo_id) runs a file that names its own artifact
    assert f"ARTIFACT = {repo_id!r}" in files["custom_generate/generate.py"].decode()
    return files


@pytest.mark.slow
def test_push_is_byte_identical_and_loads_back(saved_heads, tmp_path):
    heads, folder = saved_heads
    with HubServer() as hub:
        result = subprocess.run(
            [sys.executable, "-c", PUSH_SCRIPT, str(folder)],
            cwd=ROOT,
            env=loopback_env(hub, tmp_path / "hf-home"),
            capture_output=True,
            text=True,
            timeout=120,
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
    assert from_folder["README.md"].decode() == model_card(
        heads.config, repo_id=f"{DEFAULT_USER}/tiny-heads-from-folder"
    )
    metadata = yaml.safe_load(card.split("---")[1])
    assert metadata["library_name"] == "medusa-lite"
    assert metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "medusa" in metadata["tags"]
    assert SUMMARY["data"] in card and "120" in card and "1.844" in card
    for accuracy in ("0.438", "0.062", "0.031", "0.281", "0.047", "0.016", "0.531", "0.344"):
        assert accuracy in card
    assert 'load("HuggingFaceTB/SmolLM2-135M-Instruct", heads="alice/tiny-heads")' in card

    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    for name, data in files.items():
        (rebuilt / name).parent.mkdir(parents=True, exist_ok=True)
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
    bare = model_card(
        MedusaConfig(num_heads=3, hidden_size=8, vocab_size=16, base_model_name_or_path="/models/my-llm")
    )
    metadata = yaml.safe_load(bare.split("---")[1])
    assert "base_model" not in metadata  # a local path is not a Hub model id
    assert "/models/my-llm" in bare
    assert "No training details were recorded" in bare
    assert "accuracy" not in bare.lower() and "| rank" not in bare

    top1_only = model_card(
        MedusaConfig(num_heads=2, hidden_size=8, vocab_size=16, training_summary={"top1_accuracy": [0.5, 0.25]})
    )
    assert "| head | guesses token | top-1 |" in top1_only and "0.500" in top1_only and "0.250" in top1_only
    assert "rank 1" not in top1_only and "Mean accepted" not in top1_only and "Steps" not in top1_only


# -- a Medusa-2 artifact, pushed whole and loaded back from the Hub ------------------------------

# Runs in a fresh interpreter pointed at the loopback server: push the artifact folder, load it
# back by repo id (a fresh HF cache), decode; then the errors for a missing repo and revision.
ROUND_TRIP_SCRIPT = (
    NETWORK_GUARD
    + r"""
import shutil
import torch
from medusa_lite import generate, load
from medusa_lite.errors import ArtifactNotFoundError
from medusa_lite.artifacts.hub import push_heads_to_hub
from medusa_lite.artifacts.loading import write_tree_file
from medusa_lite.trees.tree import Tree

model_dir, heads_dir, out = sys.argv[1:4]
prompt = torch.tensor([PROMPT])
push_heads_to_hub(heads_dir, "alice/medusa2-heads")
model, _ = load(model_dir, heads="alice/medusa2-heads", prepack=False)
result = {
    "sequences": generate(model, prompt, NEW_TOKENS, lookup_tokens=0).sequences,
    "logits": model.target_forward(prompt).logits,
    "tree": [list(p) for p in model.tree.paths],
    "datastore_tokens": model.datastore.num_tokens,
}
# Branch v1: the same artifact with another tree; every file is read from the revision asked for.
v1 = shutil.copytree(heads_dir, heads_dir + "-v1")
write_tree_file(v1 + "/tree.json", Tree.from_paths(TREE_V1), {})
push_heads_to_hub(v1, "alice/medusa2-heads", revision="v1")
result["tree_v1"] = [list(p) for p in load(model_dir, heads="alice/medusa2-heads", heads_revision="v1")[0].tree.paths]
result["tree_main"] = [list(p) for p in load(model_dir, heads="alice/medusa2-heads")[0].tree.paths]
errors = {}
MISSING = {
    "repo": dict(heads="alice/no-such-heads"),
    "revision": dict(heads="alice/medusa2-heads", heads_revision="v9"),
}
for name, kwargs in MISSING.items():
    try:
        load(model_dir, **kwargs)
    except ArtifactNotFoundError as error:
        errors[name] = str(error)
result["errors"] = errors
torch.save(result, out)
"""
)


@pytest.mark.slow
def test_medusa2_artifact_round_trip_gives_the_adapted_models_outputs(tmp_path):
    model_dir, heads_dir = save_medusa2_artifact(tmp_path)
    write_tree_file(heads_dir / "tree.json", Tree.from_paths(TREE), {"note": "test"})
    Datastore.from_documents([torch.tensor([1, 2, 3, 4])], plain_target(model_dir).config.vocab_size).save(
        heads_dir / DATASTORE_FILE_NAME
    )
    script = ROUND_TRIP_SCRIPT.replace("PROMPT", repr(ROUND_TRIP_PROMPT)).replace("NEW_TOKENS", str(ROUND_TRIP_TOKENS))
    script = script.replace("TREE_V1", repr(TREE_V1))
    with HubServer() as hub:
        result = subprocess.run(
            [sys.executable, "-c", script, str(model_dir), str(heads_dir), str(tmp_path / "out.pt")],
            cwd=ROOT,
            env=loopback_env(hub, tmp_path / "hf-home"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert hub.unexpected == []
        downloaded = {
            path.split("/resolve/main/", 1)[1]
            for method, path in hub.requests
            if method == "GET" and "/resolve/main/" in path
        }
        files = hub.files("alice/medusa2-heads")
    expected_files = ["config.json", "model.safetensors", "tree.json", DATASTORE_FILE_NAME, *ADAPTER_FILES]
    assert sorted(files) == sorted([*expected_files, "README.md"])
    for name in expected_files:
        assert files[name] == (heads_dir / name).read_bytes(), f"{name} changed on the way to the Hub"
    assert downloaded == set(expected_files), "load() read every file of the artifact from the Hub"
    card = files["README.md"].decode()
    assert (
        "## Base-model adapter" in card and "rank 4" in card and "## Candidate tree" in card and "## Datastore" in card
    )

    loaded = torch.load(tmp_path / "out.pt")
    prompt = torch.tensor([ROUND_TRIP_PROMPT])
    adapted, plain = adapted_reference(model_dir, heads_dir), plain_target(model_dir)
    expected = adapted.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=ROUND_TRIP_TOKENS, do_sample=False
    )
    unadapted = plain.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=ROUND_TRIP_TOKENS, do_sample=False
    )
    assert not torch.equal(expected, unadapted), "precondition: the adapter changes the greedy output"
    assert torch.equal(loaded["sequences"], expected)
    torch.testing.assert_close(loaded["logits"], adapted(prompt).logits, atol=1e-4, rtol=1e-4)
    assert (loaded["logits"] - plain(prompt).logits).abs().max() > 0.1
    assert loaded["tree"] == loaded["tree_main"] == TREE and loaded["datastore_tokens"] == 4
    assert loaded["tree_v1"] == TREE_V1
    assert (
        "no Hub repo 'alice/no-such-heads'" in loaded["errors"]["repo"]
        and "private or gated" in loaded["errors"]["repo"]
    )
    assert "revision 'v9'" in loaded["errors"]["revision"] and "no such revision" in loaded["errors"]["revision"]


def test_push_refuses_heads_that_need_an_adapter_they_lack(tmp_path):
    _, heads_dir = save_medusa2_artifact(tmp_path)
    (heads_dir / "adapter").rename(tmp_path / "adapter")
    with pytest.raises(AdapterError, match=r"trained with a LoRA adapter.*has no adapter/adapter_config.json"):
        push_heads_to_hub(heads_dir, "alice/heads", endpoint="http://127.0.0.1:9", token=TOKEN)
    with pytest.raises(AdapterError, match="a heads module does not carry|has no adapter"):
        push_heads_to_hub(
            MedusaHeads.from_pretrained(heads_dir), "alice/heads", endpoint="http://127.0.0.1:9", token=TOKEN
        )


def test_drafting_artifacts_push_with_their_own_card_and_policy(tmp_path, monkeypatch):
    """A sequential drafter and Hydra-style heads push like heads: byte-identical files, their kind's card, a
    dynamic tree.json beside them (a static one is refused before anything is uploaded)."""
    import huggingface_hub.constants

    from medusa_lite import DynamicTree
    from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
    from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # conftest sets offline mode
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,::1")
    artifacts = {
        "hydra": (HydraHeads(HydraConfig(num_heads=3, hidden_size=8, vocab_size=16)), "Hydra-style heads"),
        "drafter": (
            SequentialDrafter(
                DrafterConfig(
                    hidden_size=8, vocab_size=16, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16
                )
            ),
            "Sequential drafter",
        ),
    }
    with HubServer() as hub:
        for name, (module, title) in artifacts.items():
            folder = tmp_path / name
            module.save_pretrained(folder)
            write_tree_file(folder / "tree.json", Tree(((0,),)), {}, DynamicTree(5, (1.0, 1.1, 1.2, 1.3)))
            push_heads_to_hub(folder, f"alice/{name}", endpoint=hub.url, token=TOKEN)
            files = assert_pushed(hub, f"alice/{name}", folder, extra=("tree.json",))
            assert title in files["README.md"].decode()
            write_tree_file(folder / "tree.json", Tree(((0,), (0, 0))), {})
            with pytest.raises(HeadsFileError, match="must be a dynamic tree"):
                push_heads_to_hub(folder, f"alice/{name}-static", endpoint=hub.url, token=TOKEN)
            assert f"alice/{name}-static" not in hub.repos
        assert hub.unexpected == []
