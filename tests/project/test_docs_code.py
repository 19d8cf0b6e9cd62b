"""The Python code blocks of README.md and docs/*.md run, so they cannot rot.

Every fenced block whose info string is ``python`` (or ``py``) is executed; the blocks of one
document run in order in one namespace, like a notebook. A block that cannot run as written
(placeholder paths, a fragment) is marked by an HTML comment on the line just before its fence::

    <!-- docs-test: skip (placeholder paths) -->

The documented substitution: without the ``integration`` marker, ``load()`` called for the
default model (no ``model``, no ``heads``) returns a tiny random model with a tiny ChatML
tokenizer instead of SmolLM2-135M, so the blocks run in seconds; every other call is real. With
``-m integration`` the blocks run exactly as written, on the real default model.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from tiny_models import random_heads, tiny_base_model
from tiny_tokenizer import TINY_VOCAB_SIZE, make_tiny_tokenizer

import medusa_lite
import medusa_lite.artifacts.loading
from medusa_lite import MedusaModel

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.MULTILINE | re.DOTALL
)
PYTHON_INFO = ("python", "py")
SKIP_MARK = re.compile(r"<!--\s*docs-test:\s*skip\b")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line of the fence, code) of each runnable Python block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        info = match.group("info").strip().split()
        if not info or info[0].lower() not in PYTHON_INFO:
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if SKIP_MARK.search(before):
            continue
        blocks.append((text.count("\n", 0, match.start()) + 1, textwrap.dedent(match.group("code"))))
    return blocks


DOCUMENTS_WITH_CODE = [path for path in documents() if path.is_file() and python_blocks(path)]


def run_blocks(path: Path) -> None:
    namespace: dict = {"__name__": "__docs__"}
    for line, code in python_blocks(path):
        exec(
            compile("\n" * line + code, str(path), "exec"), namespace
        )  # line numbers in tracebacks are the document's


def tiny_default_load(real_load):
    """``load`` that gives a tiny model for the default model (see the module docstring), else the real one."""

    def load(model=None, *, heads=None, **kwargs):
        if model is None and heads is None:
            base = tiny_base_model("llama", vocab_size=TINY_VOCAB_SIZE, seed=7, logit_scale=4.0)
            return MedusaModel(base, random_heads(base, num_heads=3)).eval(), make_tiny_tokenizer()
        return real_load(model, heads=heads, **kwargs)

    return load


def test_the_readme_has_python_code_to_run():
    assert ROOT / "README.md" in DOCUMENTS_WITH_CODE, (
        "README.md has no runnable ```python block: this test would check nothing there"
    )


def test_python_blocks_are_found_and_skip_marks_obeyed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Intro\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip (placeholder) -->\n```python\nload('path/to')\n```\n\n"
        "```bash\nls\n```\n\n- a list item:\n\n  ```py\n  y = x + 1\n  ```\n"
    )
    assert python_blocks(page) == [(3, "x = 1\n"), (18, "y = x + 1\n")]


@pytest.mark.parametrize("path", DOCUMENTS_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_on_a_tiny_model(path, monkeypatch):
    load = tiny_default_load(medusa_lite.artifacts.loading.load)
    monkeypatch.setattr(medusa_lite, "load", load)
    monkeypatch.setattr(medusa_lite.artifacts.loading, "load", load)
    run_blocks(path)


@pytest.mark.integration
@pytest.mark.parametrize("path", DOCUMENTS_WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_on_the_real_model(path):
    run_blocks(path)
