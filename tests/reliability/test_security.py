"""The promises of docs/security.md, each tried with a hostile file: weights are read only as safetensors (a pickle
in their place is refused by name and never unpickled), a target's remote code is never run, the package never
turns remote code on, and push uploads only files inside the artifact folder (symbolic links refused before any
upload)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hostile_files import pickle_bytes
from tiny_models import random_heads, tiny_base_model

from medusa_lite import HeadsFileError, load
from medusa_lite.artifacts.custom_generate import custom_generate_files
from medusa_lite.artifacts.hub import push_heads_to_hub

PACKAGE = Path(__file__).resolve().parents[2] / "medusa_lite"
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a refusal must come before any upload
VOCAB = 64


@pytest.fixture
def target_and_heads(tmp_path) -> tuple[Path, Path]:
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=1)
    base.save_pretrained(tmp_path / "target")
    random_heads(base, num_heads=2).save_pretrained(tmp_path / "heads")
    return tmp_path / "target", tmp_path / "heads"


def test_heads_weights_are_read_only_as_safetensors(target_and_heads, tmp_path):
    target, heads = target_and_heads
    marker = tmp_path / "pickle-ran"
    (heads / "model.safetensors").unlink()
    (heads / "pytorch_model.bin").write_bytes(pickle_bytes(marker))
    with pytest.raises(HeadsFileError, match="model.safetensors"):
        load(target, heads=heads, datastore=False, prepack=False)
    (heads / "model.safetensors").write_bytes(pickle_bytes(marker))  # a pickle under the safetensors name
    with pytest.raises(HeadsFileError, match="safetensors"):
        load(target, heads=heads, datastore=False, prepack=False)
    assert not marker.exists(), "a pickle in an artifact was unpickled"


def test_a_targets_remote_code_is_never_run(target_and_heads, tmp_path):
    target, heads = target_and_heads
    marker = tmp_path / "remote-code-ran"
    (target / "evil.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n")
    config = json.loads((target / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (target / "config.json").write_text(json.dumps(config))
    try:
        model, _ = load(target, heads=heads, datastore=False, prepack=False)
    except Exception:  # refusing is as good as ignoring it; running it is not
        model = None
    assert not marker.exists(), "load() ran the target folder's own code"
    assert model is None or type(model.base_model).__module__.startswith("transformers.")


def test_the_package_never_turns_remote_code_on():
    turned_on = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                    turned_on.append(f"{path.relative_to(PACKAGE)}:{node.value.lineno}")
    assert turned_on == [], f"trust_remote_code passed as other than False: {turned_on}"


def test_push_refuses_a_file_reached_through_a_link(target_and_heads, tmp_path):
    _, heads = target_and_heads
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "tree.json").write_text(json.dumps({"paths": [[0], [1]]}))
    (heads / "tree.json").symlink_to(outside / "tree.json")
    with pytest.raises(HeadsFileError, match="tree.json is a symbolic link"):
        push_heads_to_hub(heads, "alice/heads", endpoint=NOWHERE, token="t")
    (heads / "tree.json").unlink()
    (outside / "adapter").mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (outside / "adapter" / name).write_text("{}")
    (heads / "adapter").symlink_to(outside / "adapter", target_is_directory=True)
    with pytest.raises(HeadsFileError, match="adapter is a symbolic link"):
        push_heads_to_hub(heads, "alice/heads", endpoint=NOWHERE, token="t")


def test_the_custom_generate_file_imports_medusa_lite_and_does_nothing_else():
    files = custom_generate_files("alice/heads")
    (source,) = [text for name, text in files.items() if name.endswith(".py")]
    body = ast.parse(source).body
    kinds = [type(node).__name__ for node in body]
    assert kinds == ["Expr", "Import", "Assign", "FunctionDef"], kinds  # docstring, import, constant, function
    assert [alias.name for alias in body[1].names] == ["medusa_lite"]
    assert isinstance(body[2].value, ast.Constant) and body[2].value.value == "alice/heads"
    calls = {ast.unparse(node.func) for node in ast.walk(body[3]) if isinstance(node, ast.Call)}
    assert calls == {"medusa_lite.attach", "medusa_lite.attach(model, heads, prepack=False, adapt=False).generate"}
