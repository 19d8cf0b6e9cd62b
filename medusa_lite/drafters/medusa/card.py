"""The Hub model card (``README.md``) of Medusa heads, built from what its files record.

:func:`model_card` renders the heads' config (base model, shape, ``training_summary``: data,
steps, per-head accuracies, mean accepted tokens) and what else the artifact holds (a LoRA
adapter, a calibrated ``tree.json``, a datastore). Nothing in the card is made up: a fact that
is not in the files does not appear. ``MedusaHeads.save_pretrained`` writes it and
:func:`medusa_lite.artifacts.hub.push_heads_to_hub` uploads it.
"""

from __future__ import annotations

import json
import math
from numbers import Real
from typing import TYPE_CHECKING

from huggingface_hub import ModelCard, ModelCardData

from medusa_lite.artifacts.card import LIBRARY_NAME, PROJECT_URL, is_hub_model_id
from medusa_lite.drafters.medusa.config import MedusaConfig

if TYPE_CHECKING:
    from medusa_lite.proposers.datastore import Datastore

TAGS = ("medusa-lite", "speculative-decoding", "medusa")
_KNOWN_SUMMARY_KEYS = ("data", "steps", "top1_accuracy", "topk_accuracy", "mean_accepted_tokens")


def model_card(
    config: MedusaConfig,
    *,
    repo_id: str | None = None,
    datastore: Datastore | None = None,
    adapter: dict | None = None,
    tree: dict | None = None,
) -> str:
    """The ``README.md`` (YAML metadata + Markdown) of heads with this config.

    ``adapter``: the artifact's ``adapter/adapter_config.json`` values; ``tree``: its ``tree.json``
    values; ``datastore``: its datastore; each described when given.
    """
    base = config.base_model_name_or_path
    card_data = ModelCardData(
        library_name=LIBRARY_NAME,
        base_model=base if is_hub_model_id(base) else None,
        base_model_relation="adapter" if is_hub_model_id(base) else None,
        tags=list(TAGS),
    )
    sections = [
        _overview(config, adapter),
        _usage(config, repo_id),
        _adapter(adapter),
        _tree(tree),
        _datastore(datastore),
        _training(config.training_summary or {}),
    ]
    content = f"---\n{card_data.to_yaml()}\n---\n\n" + "\n\n".join(s for s in sections if s) + "\n"
    return str(ModelCard(content, ignore_metadata_errors=False))


# -- sections --------------------------------------------------------------------------------


def _overview(config: MedusaConfig, adapter: dict | None) -> str:
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
        draft_line = [
            f"| draft vocabulary | the heads guess among {config.draft_vocab_size} of the {config.vocab_size} tokens "
            "(stored in `draft_token_ids`) |"
        ]
    head_params = config.num_layers * (config.hidden_size**2 + config.hidden_size)
    if not config.use_base_lm_head:
        head_params += config.hidden_size * config.vocab_size
    fuse_params = 2 * config.hidden_size**2 + config.hidden_size if config.next_token_input else 0
    next_token_line = []
    if config.next_token_input:
        next_token_line = [
            "| next-token input | the heads also read token t+1 (its input embedding, fused with the hidden state by "
            f"one shared {2 * config.hidden_size} x {config.hidden_size} layer) |"
        ]
    adapter_line = (
        ["| base-model adapter | LoRA in `adapter/`, trained with the heads (Medusa-2) |"] if adapter else []
    )
    total_params = head_params * config.num_heads + fuse_params
    shared = f", {fuse_params:,} shared" if fuse_params else ""
    contents = (
        "These files are the heads and a LoRA adapter of the base model, not the base model itself: the heads were "
        "trained on the adapted model, and medusa-lite applies the adapter when it loads them, so the outputs are "
        "exactly the *adapted* model's."
        if adapter
        else "These files are the heads only, not the base model."
    )
    return "\n".join(
        [
            title,
            "",
            f"{config.num_heads} [Medusa](https://arxiv.org/abs/2401.10774) heads for speculative decoding of "
            f"{base_text} "
            f"with [medusa-lite]({PROJECT_URL}). Each head reads the base model's last hidden state and guesses a "
            "token further ahead (where the base model predicts token t+1, head k guesses token t+1+k); "
            "the base model then verifies a tree of guesses in one forward pass. The acceptance rule is exact: greedy "
            "output is token-identical to the base model's, and sampled output follows the base model's own "
            f"distribution. {contents}",
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
            *adapter_line,
            f"| output layer | {projection} |",
            f"| parameters | {total_params:,} ({head_params:,} per head{shared}) |",
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
            "from medusa_lite import generate, load",
            "",
            "# the base model with everything these files hold: heads, adapter, tree, datastore",
            f'model, tokenizer = load("{base}", heads="{heads_source}")',
            'messages = [{"role": "user", "content": "Write a haiku about the sea."}]',
            "prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)",
            'input_ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids',
            "out = generate(model, input_ids, max_new_tokens=128)  # temperature=0.7 etc. samples exactly",
            "print(tokenizer.decode(out.sequences[0, input_ids.shape[1]:]))",
            "print(out.stats.mean_accepted_tokens)",
            "```",
        ]
    )


def _adapter(adapter: dict | None) -> str:
    if not adapter:
        return ""
    facts = []
    if "r" in adapter:
        facts.append(f"rank {_text(adapter['r'])}")
    if "lora_alpha" in adapter:
        facts.append(f"alpha {_text(adapter['lora_alpha'])}")
    targets = adapter.get("target_modules")
    if targets:
        facts.append(
            "on " + ", ".join(f"`{t}`" for t in sorted(targets)) if isinstance(targets, list) else f"on `{targets}`"
        )
    kind = adapter.get("peft_type", "LoRA")
    return (
        "## Base-model adapter\n\n"
        f"`adapter/` is a [PEFT](https://github.com/huggingface/peft) {_text(kind)} adapter"
        + (f" ({', '.join(facts)})" if facts else "")
        + ", trained jointly with the heads (Medusa-2). `medusa_lite.load` merges it into the base model's weights "
        "before decoding; the heads do not fit the unadapted model."
    )


def _tree(tree: dict | None) -> str:
    if not tree:
        return ""
    paths = tree.get("paths")
    nodes = len(paths) if isinstance(paths, list) else None
    dynamic = tree.get("dynamic") if isinstance(tree.get("dynamic"), dict) else None
    text = "## Candidate tree\n\n`tree.json` holds the tree `medusa_lite.load` decodes with"
    if dynamic is not None:
        text += f": a per-step dynamic tree of up to {_text(dynamic.get('max_nodes'))} nodes"
        text += f" (and a static tree of {nodes} nodes)" if nodes is not None else ""
    elif nodes is not None:
        text += f": a static tree of {nodes} nodes"
    return text + (
        ". It was sized to the machine it was calibrated on (`infer/calibrate_tree.py`); calibrate again on yours. "
        "Any tree gives the same outputs; only the speed differs."
    )


def _datastore(datastore: Datastore | None) -> str:
    if datastore is None:
        return ""
    return (
        "## Datastore\n\n"
        f"`datastore.safetensors` holds {datastore.num_tokens:,} tokens of {datastore.num_documents:,} answers of the "
        "base model (the heads' training split). Where the text being generated has no earlier match of its last "
        "tokens, medusa-lite guesses what followed the same tokens in these answers; the base model verifies those "
        "guesses like any other, so outputs stay exact. `medusa_lite.load(model, heads=...)` picks the file up; "
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
    rows_ok = isinstance(topk, (list, tuple)) and topk and all(isinstance(r, (list, tuple)) for r in topk)
    topk = topk if rows_ok else None
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
        note = [
            "",
            "Rank r: how often the head's r-th most likely token was the right one "
            "(ranks are disjoint, so they sum to top-k accuracy).",
        ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]
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
