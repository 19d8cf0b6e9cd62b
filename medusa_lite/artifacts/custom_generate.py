"""The ``custom_generate/`` folder of an artifact: medusa-lite behind transformers' own ``model.generate``.

transformers (>= 4.56) runs a decoding method kept in a repository or a local folder when
``model.generate`` is given ``custom_generate=<that folder or Hub repo>`` and
``trust_remote_code=True``: it imports ``custom_generate/generate.py`` there and calls its
``generate(model, **the call's arguments)``. The one written here attaches the artifact's drafter
to ``model`` (:func:`medusa_lite.attach`, the target left as it is: no prepacking) and decodes with
:meth:`MedusaModel.generate`, which takes and returns what ``model.generate`` does::

    base.generate(**inputs, custom_generate="user/heads", trust_remote_code=True, max_new_tokens=64)

transformers copies the file into its module cache before importing it, so the file cannot find its
folder: the artifact is named inside it (:data:`ARTIFACT_LINE`), by ``medusa-lite push`` as the Hub
repo it pushes to, and left None elsewhere (the heads shipped for the default model; any other
artifact is then named in the call: ``medusa_heads=<folder or repo>``). What the file runs: the
imports of ``medusa_lite`` and ``attach`` + ``generate``, nothing else (docs/how-it-works.md).
"""

from __future__ import annotations

import os
from pathlib import Path

CUSTOM_GENERATE_DIR = "custom_generate"
GENERATE_FILE = "generate.py"
REQUIREMENTS_FILE = "requirements.txt"
# transformers installs these before running the file (check_python_requirements).
REQUIREMENTS = "medusa-lite\n"
ARTIFACT_LINE = "ARTIFACT = {artifact!r}"

GENERATE_TEMPLATE = '''"""medusa-lite: exact speculative decoding as a transformers custom_generate method.

    model.generate(**inputs, custom_generate=<this repo or folder>, trust_remote_code=True, ...)

decodes with the drafter of the artifact named below (or medusa_heads=<folder or repo> in the call),
token for token what model.generate gives greedily and in distribution when sampling. Written by
medusa-lite (medusa_lite/artifacts/custom_generate.py); it imports medusa_lite and runs nothing else.
"""

import medusa_lite

{artifact_line}  # None: the heads medusa-lite ships for its default model


def generate(model, *args, medusa_heads=None, **kwargs):
    """model.generate's arguments and return value; the target is left as it is."""
    heads = medusa_heads if medusa_heads is not None else ARTIFACT
    return medusa_lite.attach(model, heads, prepack=False, adapt=False).generate(*args, **kwargs)
'''


def custom_generate_source(artifact: str | None = None) -> str:
    """The text of ``custom_generate/generate.py`` for the artifact named ``artifact`` (None: see the module)."""
    return GENERATE_TEMPLATE.format(artifact_line=ARTIFACT_LINE.format(artifact=artifact))


def custom_generate_files(artifact: str | None = None) -> dict[str, str]:
    """The folder's files (paths relative to the artifact, ``/``-separated) and their texts."""
    return {
        f"{CUSTOM_GENERATE_DIR}/{GENERATE_FILE}": custom_generate_source(artifact),
        f"{CUSTOM_GENERATE_DIR}/{REQUIREMENTS_FILE}": REQUIREMENTS,
    }


def write_custom_generate(folder: str | os.PathLike, artifact: str | None = None) -> Path:
    """Write ``folder/custom_generate/`` (the method and its requirements); return that folder."""
    (Path(folder) / CUSTOM_GENERATE_DIR).mkdir(parents=True, exist_ok=True)
    for name, text in custom_generate_files(artifact).items():
        (Path(folder) / name).write_text(text, encoding="utf-8")
    return Path(folder) / CUSTOM_GENERATE_DIR
