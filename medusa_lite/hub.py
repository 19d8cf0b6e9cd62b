"""Publish Medusa heads on the Hugging Face Hub: a generated model card and a one-commit push.

``push_heads_to_hub`` uploads exactly the files of the heads format (``config.json`` and
``model.safetensors``, as :meth:`MedusaHeads.save_pretrained` writes them; ``datastore.safetensors``
too where the folder has one) plus a ``README.md``
model card built by :func:`model_card` from the config: base model, shape, how to load the heads,
and whatever ``config.training_summary`` records about training (data, steps, per-head
accuracies, mean accepted tokens). Nothing in the card is made up: a fact that is not in the
config does not appear.

The upload goes through ``huggingface_hub`` (``HfApi.create_repo`` + ``HfApi.create_commit``),
so ``HF_TOKEN`` / ``hf auth login`` and ``HF_ENDPOINT`` work as everywhere in the ecosystem.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from numbers import Real
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, ModelCard, ModelCardData

from medusa_lite.datastore import DATASTORE_FILE_NAME, Datastore
from medusa_lite.errors import HeadsFileError
from medusa_lite.heads import CONFIG_NAME, WEIGHTS_NAME, MedusaConfig, MedusaHeads

LIBRARY_NAME = "medusa-lite"
TAGS = ["medusa-lite", "speculative-decoding", "medusa"]
PROJECT_URL = "https://github.com/medusa-lite/medusa-lite"
CARD_NAME = "README.md"

# A Hub model id ("name" or "namespace/name"); anything else (a local path) is named in the card's
# text but kept out of the `base_model` metadata, which the Hub only accepts for models it hosts.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
_KNOWN_SUMMARY_KEYS = ("data", "steps", "top1_accuracy", "topk_accuracy", "mean_accepted_tokens")


def model_card(config: MedusaConfig, *, repo_id: str | None = None, datastore: Datastore | None = None) -> str:
    """The ``README.md`` (YAML metadata + Markdown) describing heads with this config (and the datastore uploaded with them)."""
    base = config.base_model_name_or_path
    card_data = ModelCardData(
        library_name=LIBRARY_NAME,
        base_model=base if _is_hub_model_id(base) else None,
        base_model_relation="adapter" if _is_hub_model_id(base) else None,
        tags=list(TAGS),
    )
    sections = [_overview(config), _usage(config, repo_id), _datastore(datastore), _training(config.training_summary or {})]
    content = f"---\n{card_data.to_yaml()}\n---\n\n" + "\n\n".join(s for s in sections if s) + "\n"
    return str(ModelCard(content, ignore_metadata_errors=False))


def push_heads_to_hub(
    heads_or_dir: MedusaHeads | str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    private: bool = False,
    commit_message: str = "Upload Medusa heads",
    revision: str | None = None,
    endpoint: str | None = None,
) -> str:
    """Upload heads (a :class:`MedusaHeads` or a folder saved by it) with a model card, in one commit.

    Creates the repo if needed (``exist_ok``) and the branch ``revision`` if given. A folder must
    hold ``config.json`` and ``model.safetensors`` that load strictly; those two files, the
    folder's ``datastore.safetensors`` if it has one (checked to load, for the heads' vocabulary)
    and a freshly generated ``README.md`` are uploaded (other files in the folder are left alone).
    ``endpoint`` defaults to ``HF_ENDPOINT`` / https://huggingface.co. Returns the commit URL.
    """
    api = HfApi(endpoint=endpoint, token=token)
    with tempfile.TemporaryDirectory(prefix="medusa-heads-") as tmp:
        if isinstance(heads_or_dir, MedusaHeads):
            folder = Path(tmp)
            heads_or_dir.save_pretrained(folder)
            config = heads_or_dir.config
        elif isinstance(heads_or_dir, (str, os.PathLike)):
            folder = Path(heads_or_dir)
            config = _check_heads_folder(folder)
        else:
            raise TypeError(f"push_heads_to_hub expects MedusaHeads or a heads folder path, got {type(heads_or_dir).__name__}")
        datastore_path = folder / DATASTORE_FILE_NAME if (folder / DATASTORE_FILE_NAME).is_file() else None
        datastore = Datastore.load(datastore_path, config.vocab_size) if datastore_path is not None else None  # refuse a bad file before any upload

        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        if revision is not None:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        card = model_card(config, repo_id=repo_id, datastore=datastore).encode("utf-8")
        operations = [
            CommitOperationAdd(path_in_repo=CONFIG_NAME, path_or_fileobj=str(folder / CONFIG_NAME)),
            CommitOperationAdd(path_in_repo=WEIGHTS_NAME, path_or_fileobj=str(folder / WEIGHTS_NAME)),
            CommitOperationAdd(path_in_repo=CARD_NAME, path_or_fileobj=card),
        ]
        if datastore_path is not None:
            operations.append(CommitOperationAdd(path_in_repo=DATASTORE_FILE_NAME, path_or_fileobj=str(datastore_path)))
        commit = api.create_commit(repo_id, operations, commit_message=commit_message, revision=revision)
    return commit.commit_url


# -- folder check ----------------------------------------------------------------------------


def _check_heads_folder(folder: Path) -> MedusaConfig:
    """Refuse to push a folder that ``MedusaHeads.from_pretrained`` could not load."""
    if not folder.exists():
        raise HeadsFileError(f"cannot push {folder}: no such folder (expected a Medusa heads folder holding {CONFIG_NAME} and {WEIGHTS_NAME})")
    if not folder.is_dir():
        raise HeadsFileError(f"cannot push {folder}: it is a file; pass the heads folder holding {CONFIG_NAME} and {WEIGHTS_NAME}")
    missing = [name for name in (CONFIG_NAME, WEIGHTS_NAME) if not (folder / name).is_file()]
    if missing:
        raise HeadsFileError(
            f"cannot push {folder}: missing {' and '.join(missing)}; a Medusa heads folder holds {CONFIG_NAME} and "
            f"{WEIGHTS_NAME} (write one with MedusaHeads.save_pretrained)"
        )
    try:
        return MedusaHeads.from_pretrained(folder).config  # strict: config and weights must agree
    except HeadsFileError as error:
        raise HeadsFileError(f"cannot push {folder}: {error}") from error


def _is_hub_model_id(name: str | None) -> bool:
    return bool(name) and _REPO_ID.match(name) is not None and ".." not in name and not name.startswith(".")


# -- card sections ---------------------------------------------------------------------------


def _overview(config: MedusaConfig) -> str:
    base = config.base_model_name_or_path
    base_text = f"`{base}`" if base else "an unrecorded base model"
    title = f"# Medusa heads for {base}" if base else "# Medusa heads"
    projection = (
        "the base model's own output layer (frozen, shared by all heads)"
        if config.use_base_lm_head
        else "one output layer per head (initialised from the base model's)"
    )
    draft_line = []
    if config.draft_vocab_size is not None:
        draft_line = [f"| draft vocabulary | the heads guess among {config.draft_vocab_size} of the {config.vocab_size} tokens (stored in `draft_token_ids`) |"]
    head_params = config.num_layers * (config.hidden_size**2 + config.hidden_size)
    if not config.use_base_lm_head:
        head_params += config.hidden_size * config.vocab_size
    fuse_params = 2 * config.hidden_size**2 + config.hidden_size if config.next_token_input else 0
    next_token_line = []
    if config.next_token_input:
        next_token_line = [f"| next-token input | the heads also read token t+1 (its input embedding, fused with the hidden state by one shared {2 * config.hidden_size} x {config.hidden_size} layer) |"]
    total_params = head_params * config.num_heads + fuse_params
    return "\n".join(
        [
            title,
            "",
            f"{config.num_heads} [Medusa](https://arxiv.org/abs/2401.10774) heads for speculative decoding of {base_text} "
            f"with [medusa-lite]({PROJECT_URL}). Each head reads the base model's last hidden state and guesses a "
            "token further ahead (where the base model predicts token t+1, head k guesses token t+1+k); "
            "the base model then verifies a tree of guesses in one forward pass. The acceptance rule is exact: greedy "
            "output is token-identical to the base model's, and sampled output follows the base model's own "
            "distribution. These files are the heads only, not the base model.",
            "",
            "| | |",
            "|---|---|",
            f"| base model | {base_text} |",
            f"| heads | {config.num_heads} |",
            f"| residual SiLU blocks per head | {config.num_layers} |",
            f"| hidden size | {config.hidden_size} |",
            f"| vocabulary | {config.vocab_size} |",
            *draft_line,
            *next_token_line,
            f"| output layer | {projection} |",
            f"| parameters | {total_params:,} ({head_params:,} per head" + (f", {fuse_params:,} shared" if fuse_params else "") + ") |",
        ]
    )


def _usage(config: MedusaConfig, repo_id: str | None) -> str:
    heads_source = repo_id or "path/to/these/heads"
    base = config.base_model_name_or_path or "BASE_MODEL"  # the config does not name it
    return "\n".join(
        [
            "## Usage",
            "",
            "```bash",
            "pip install medusa-lite",
            "```",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "from medusa_lite import MedusaHeads, MedusaModel, generate",
            "",
            f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            f'heads = MedusaHeads.from_pretrained("{heads_source}")',
            "model = MedusaModel(base, heads)",
            "",
            'messages = [{"role": "user", "content": "Write a haiku about the sea."}]',
            "prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)",
            'input_ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids',
            "out = generate(model, input_ids, max_new_tokens=128)  # temperature=0.7 etc. samples exactly",
            "print(tokenizer.decode(out.sequences[0, input_ids.shape[1]:]))",
            "print(out.stats.mean_accepted_tokens)",
            "```",
        ]
    )


def _datastore(datastore: Datastore | None) -> str:
    if datastore is None:
        return ""
    return (
        "## Datastore\n\n"
        f"`{DATASTORE_FILE_NAME}` holds {datastore.num_tokens:,} tokens of {datastore.num_documents:,} answers of the base model "
        "(the heads' training split). Where the text being generated has no earlier match of its last tokens, "
        "medusa-lite guesses what followed the same tokens in these answers; the base model verifies those guesses "
        "like any other, so outputs stay exact. `medusa_lite.load(model, heads=...)` picks the file up; "
        "`generate(..., datastore=False)` decodes without it."
    )


def _training(summary: dict) -> str:
    if not summary:
        return "## Training\n\nNo training details were recorded with these heads."
    lines = ["## Training", ""]
    if "data" in summary:
        lines.append(f"- **Data:** {_text(summary['data'])}")
    if "steps" in summary:
        lines.append(f"- **Steps:** {_text(summary['steps'])}")
    if "mean_accepted_tokens" in summary:
        lines.append(
            f"- **Mean accepted tokens per base-model forward:** {_text(summary['mean_accepted_tokens'])} "
            "(medusa-lite convention: the bonus token is counted, so plain decoding scores 1.00)"
        )
    others = {k: v for k, v in summary.items() if k not in _KNOWN_SUMMARY_KEYS}
    for key, value in others.items():
        lines.append(f"- **{key}:** {_text(value)}")
    table = _accuracy_table(summary.get("top1_accuracy"), summary.get("topk_accuracy"))
    if table:
        lines += ["", "### Per-head accuracy", "", table]
    return "\n".join(lines).rstrip()


def _accuracy_table(top1, topk) -> str:
    top1 = top1 if isinstance(top1, (list, tuple)) and top1 else None
    topk = topk if isinstance(topk, (list, tuple)) and topk and all(isinstance(r, (list, tuple)) for r in topk) else None
    if top1 is None and topk is None:
        return ""
    ranks = max((len(row) for row in topk), default=0) if topk else 0
    header = ["head", "guesses token"] + (["top-1"] if top1 else []) + [f"rank {r + 1}" for r in range(ranks)]
    if ranks > 1:
        header.append(f"top-{ranks} (sum of ranks)")
    rows = []
    for k in range(max(len(top1 or []), len(topk or []))):
        row = [str(k + 1), f"t+{k + 2}"]
        if top1:
            row.append(_number(top1[k]) if k < len(top1) else "")
        if topk:
            values = list(topk[k]) if k < len(topk) else []
            row += [_number(values[r]) if r < len(values) else "" for r in range(ranks)]
            if ranks > 1:
                numeric = all(isinstance(v, Real) and not isinstance(v, bool) for v in values) and len(values) == ranks
                row.append(_number(sum(values)) if numeric else "")
        rows.append(row)
    note = []
    if topk:
        note = ["", "Rank r: how often the head's r-th most likely token was the right one (ranks are disjoint, so they sum to top-k accuracy)."]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines + note)


def _number(value) -> str:
    if isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)
    return _text(value)


def _text(value) -> str:
    if isinstance(value, str):
        return value.replace("|", "\\|").replace("\n", " ")
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, Real)) for v in value):
        return ", ".join(_text(v) if isinstance(v, str) else _number(v) for v in value)
    return json.dumps(value, default=str).replace("|", "\\|")
