"""The scripts in experiments/ still import: they use only the installed package (and experiments/common.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SCRIPTS = sorted(path.stem for path in EXPERIMENTS.glob("*.py"))


def test_there_are_experiments_to_import():
    assert "common" in SCRIPTS and len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.slow
def test_every_experiment_imports():
    """One child process imports every script as a module (their work runs only under ``__main__``)."""
    code = "\n".join(f"import {name}" for name in SCRIPTS) + "\nprint('imported', len(dir()))"
    child = subprocess.run([sys.executable, "-c", code], cwd=EXPERIMENTS, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    assert "imported" in child.stdout


def test_no_experiment_reaches_into_the_repository_through_sys_path():
    for path in EXPERIMENTS.glob("*.py"):
        assert "sys.path" not in path.read_text(), f"{path.name} changes sys.path"
