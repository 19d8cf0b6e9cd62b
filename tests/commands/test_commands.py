"""The ``medusa-lite`` subcommands: dispatch, each one's own help, and the commands of an installed package."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
import yaml
from hub_server import HubServer
from tiny_checkpoint import save_tiny_checkpoint
from tiny_tokenizer import TINY_VOCAB_SIZE, make_tiny_tokenizer
from training_fixtures import CYCLE, REPO_ROOT, TINY_CONFIG, save_tiny_target, write_pattern_data

from medusa_lite.cli import GENERATE, SUBCOMMANDS, main, split_command
from medusa_lite.proposers.datastore import SEPARATOR, Datastore

TOKEN = "hf_loopback_test_token"
NUM_RECORDS = 40
PACKAGE_FILES = ("pyproject.toml", "README.md", "medusa_lite")  # what `pip install .` builds from
INSTALLED_CHECK = "calibrate"  # the subcommand run through the installed console script


def test_generate_is_the_default_subcommand():
    assert split_command(["--prompt", "hi"]) == (GENERATE, ["--prompt", "hi"])
    assert split_command(["generate", "--prompt", "hi"]) == (GENERATE, ["--prompt", "hi"])
    assert split_command([]) == (GENERATE, [])
    assert split_command(["train", "--config", "x.yaml"]) == ("train", ["--config", "x.yaml"])


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_its_own_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: medusa-lite {name}")


def test_generate_help_names_the_other_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--prompt" in out and all(name in out for name in SUBCOMMANDS)


def test_a_subcommand_error_is_a_clear_message_and_exit_status_2(tmp_path, capsys):
    assert (
        main(["build-datastore", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "d.safetensors")])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("medusa-lite build-datastore: error: ") and "missing.yaml" in err


def test_build_datastore_keeps_the_training_answers(tmp_path, capsys):
    model_dir = save_tiny_target(tmp_path / "model")
    data = write_pattern_data(tmp_path / "data.jsonl", NUM_RECORDS)
    config = yaml.safe_load(TINY_CONFIG.read_text()) | {"model": str(model_dir), "data": str(data)}
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    out = tmp_path / "heads" / "datastore.safetensors"

    assert main(["build-datastore", "--config", str(config_path), "--out", str(out)]) == 0
    datastore = Datastore.load(out, TINY_VOCAB_SIZE)
    held_out = round(NUM_RECORDS * config["eval_fraction"])
    assert datastore.num_documents == NUM_RECORDS - held_out  # the held-out split stays unseen
    tokenizer = make_tiny_tokenizer()
    answers = [tokenizer.decode(ids, skip_special_tokens=True).split() for ids in split_documents(datastore)]
    assert all(words and set(words) <= set(CYCLE) for words in answers), "a document is not an answer's words"
    assert f"wrote {out}" in capsys.readouterr().out


def split_documents(datastore: Datastore) -> list[list[int]]:
    documents, current = [], []
    for token in datastore.tokens.tolist():
        if token == SEPARATOR:
            documents.append(current)
            current = []
        else:
            current.append(token)
    return documents


def test_push_uploads_the_heads_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # conftest sets offline mode
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost,::1")
    _, heads_dir = save_tiny_checkpoint(tmp_path)
    with HubServer() as hub:
        code = main(["push", str(heads_dir), "alice/tiny-heads", "--endpoint", hub.url, "--token", TOKEN])
        files = hub.files("alice/tiny-heads")
        assert hub.unexpected == []
    assert code == 0 and "pushed" in capsys.readouterr().out
    for name in ("config.json", "model.safetensors"):
        assert files[name] == (heads_dir / name).read_bytes()


@pytest.mark.slow
def test_installed_package_runs_its_subcommands(tmp_path):
    """``pip install .`` (no extras, no dependencies: they come from this environment) installs the commands.

    Outside the repository, with only the installed copy on the path, every subcommand's module
    imports from that copy and the installed console script runs a subcommand.
    """
    source = tmp_path / "source"
    source.mkdir()
    for name in PACKAGE_FILES:
        if (REPO_ROOT / name).is_dir():
            shutil.copytree(REPO_ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO_ROOT / name, source / name)
    site = tmp_path / "site"
    install = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--target",
        str(site),
        str(source),
    ]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site)}
    modules = [*(target.split(":")[0] for target in SUBCOMMANDS.values()), "medusa_lite.cli"]
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import importlib; print(*(importlib.import_module(m).__file__ for m in {modules!r}))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert all(Path(path).is_relative_to(site) for path in where.stdout.split()), where.stdout
    done = subprocess.run(
        [str(site / "bin" / "medusa-lite"), INSTALLED_CHECK, "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith(f"usage: medusa-lite {INSTALLED_CHECK}"), done.stderr


def test_no_test_touches_sys_path_or_imports_another_test_module():
    """Tests import the package, and share helpers through helper modules (not through each other)."""
    offenders = []
    for path in sorted((REPO_ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                offenders.append(f"{path.name}:{node.lineno} uses sys.path")
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            offenders += [f"{path.name}:{node.lineno} imports {name}" for name in names if name.startswith("test_")]
    assert offenders == []


def test_tests_are_laid_out_by_subpackage():
    """Each test file sits in the folder of the part it tests; tests/ itself holds only the shared helpers."""
    tests = REPO_ROOT / "tests"
    assert sorted(path.name for path in tests.glob("test_*.py")) == []
    folders = {path.parent.name for path in tests.rglob("test_*.py")}
    package_parts = {path.name for path in (REPO_ROOT / "medusa_lite").iterdir() if (path / "__init__.py").exists()}
    assert folders - package_parts <= {"reliability", "project"}, folders - package_parts
