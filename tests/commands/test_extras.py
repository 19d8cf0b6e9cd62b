"""Decoding needs none of the optional extras; a feature that needs a missing one names the extra."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from medusa_lite.extras import EXTRA_OF_PACKAGE, MissingExtraError, install_command, require_extra

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]

# Run first in the child: from then on the optional packages cannot be found, exactly as if they
# were not installed (the path finder is replaced by one that does not see them).
BLOCK_EXTRAS = textwrap.dedent(
    f"""
    import importlib.machinery
    import sys

    BLOCKED = {sorted(EXTRA_OF_PACKAGE)!r}

    class PathFinderWithoutExtras(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                return None
            return super().find_spec(name, path, target)

    sys.meta_path = [
        PathFinderWithoutExtras if finder is importlib.machinery.PathFinder else finder for finder in sys.meta_path
    ]
    for name in list(sys.modules):
        assert name.split(".")[0] not in BLOCKED, f"{{name}} was imported before the blocker"
    """
)

GENERATE_WITHOUT_EXTRAS = textwrap.dedent(
    """
    import torch
    import medusa_lite
    from medusa_lite import generate
    from tiny_models import tiny_base_model, tiny_medusa

    model = tiny_medusa()
    prompt = torch.tensor([[1, 2, 3, 4]])
    out = generate(model, prompt, max_new_tokens=12)
    plain = tiny_base_model().generate(prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(out.sequences, plain), (out.sequences, plain)
    loaded = sorted({name.split(".")[0] for name in sys.modules} & set(BLOCKED))
    assert not loaded, loaded

    from medusa_lite.extras import MissingExtraError
    from medusa_lite.training.data import read_records
    try:
        read_records("no-such-file.jsonl")
    except MissingExtraError as error:
        print("MISSING:", error)
    else:
        raise AssertionError("read_records ran without the datasets package")
    print("GENERATED", out.sequences.shape[1] - prompt.shape[1])
    """
)


def run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_EXTRAS + code],
        capture_output=True,
        text=True,
        cwd=TESTS,
        env={**os.environ, "PYTHONPATH": f"{REPO_ROOT}:{TESTS}"},
        timeout=300,
    )


@pytest.mark.slow
def test_import_and_generate_need_no_extra():
    child = run_child(GENERATE_WITHOUT_EXTRAS)
    assert child.returncode == 0, child.stderr
    assert "GENERATED 12" in child.stdout
    assert "Reading training data needs the 'datasets' package" in child.stdout
    assert "pip install 'medusa-lite[train]'" in child.stdout


def test_the_blocker_really_refuses_an_installed_extra():
    """The child's blocker is what makes the test above meaningful: it must refuse real packages."""
    assert all(importlib.util.find_spec(package) for package in ("peft", "accelerate", "datasets"))
    child = run_child("import peft\n")
    assert child.returncode != 0 and "No module named 'peft'" in child.stderr


def test_require_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # None in sys.modules: importing it fails
    with pytest.raises(MissingExtraError, match=r"needs the 'gguf' package.*pip install 'medusa-lite\[gguf\]'"):
        require_extra("gguf", "Converting the default model from its GGUF file")


def test_every_optional_package_has_an_extra_in_pyproject():
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    for package, extra in EXTRA_OF_PACKAGE.items():
        assert install_command(package) == f"pip install 'medusa-lite[{extra}]'"
        extra_line = next(line for line in pyproject.splitlines() if line.startswith(f"{extra} = ["))
        assert f'"{package}' in extra_line, (package, extra_line)
