"""The notebooks run top to bottom (on a tiny random model), so they cannot rot."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from tiny_checkpoint import save_tiny_checkpoint

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
TIMEOUT_SECONDS = 300


def run_notebook(name: str, parameters: str, workdir: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    cells = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{name} needs exactly one cell tagged 'parameters'"
    cells[0].source = parameters
    NotebookClient(
        notebook, timeout=TIMEOUT_SECONDS, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    ).execute()
    return notebook


def outputs_text(notebook) -> str:
    return "\n".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []))


@pytest.mark.slow
def test_quickstart_runs_on_a_tiny_model(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    parameters = (
        f'MODEL = "{model_dir}"\nHEADS = "{heads_dir}"\nDTYPE = "fp32"\nMAX_NEW_TOKENS = 24\nPROMPT = "hello there"'
    )
    notebook = run_notebook("quickstart.ipynb", parameters, tmp_path)
    text = outputs_text(notebook)
    assert "identical: True" in text and "mean accepted tokens per target call" in text
    images = [o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the acceptance plot was not drawn"


@pytest.mark.slow
def test_train_heads_notebook_runs_end_to_end_on_a_tiny_model(tmp_path):
    from tiny_models import make_chatty_model
    from tiny_tokenizer import make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    make_chatty_model(tokenizer).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    repo = NOTEBOOKS.parent
    parameters = (
        f'MODEL = "{tmp_path / "model"}"\nDATA = None\nNUM_SAMPLES = 16\n'
        f'CONFIG = "{repo / "configs" / "tiny_test.yaml"}"\nOVERRIDES = ["--max_steps", "20", "--num_heads", "2"]\n'
        f'OUTPUT_DIR = "{tmp_path / "run"}"\nPROMPT = "hello there"'
    )
    notebook = run_notebook("train_heads.ipynb", parameters, NOTEBOOKS)
    text = outputs_text(notebook)
    assert "identical to plain greedy: True" in text
    assert (tmp_path / "run" / "heads" / "model.safetensors").is_file()
