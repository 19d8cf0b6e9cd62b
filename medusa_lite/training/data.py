"""Training data: read with ``datasets``, tokenised with the target's chat template, masked.

Two kinds of file:

- conversations (``.jsonl`` / ``.json``): ShareGPT records ``{"conversations": [{"from":
  "human"|"gpt"|"system", "value": ...}]}`` or chat records ``{"messages": [{"role", "content"}]}``.
  Rendered with the tokenizer's chat template; only assistant tokens are training targets
  (system and user turns are masked).
- plain text (``.txt``, or JSON records with a ``"text"`` field): every token is a target;
  documents are packed into blocks of ``max_length`` tokens.

Which tokens belong to the assistant is found by rendering the conversation prefix by prefix:
the characters added by an assistant turn (its content and end-of-turn marker, not the
``<|im_start|>assistant`` header, which the generation prompt already holds) are the response;
tokens are mapped to characters with the fast tokenizer's offsets, so it works for any template
that renders prefixes as prefixes. Nothing is dropped silently: skipped conversations and
truncated ones are counted by reason and reported.
"""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from medusa_lite.extras import require_extra
from medusa_lite.training.errors import (
    EmptyDatasetError,
    MissingChatTemplateError,
    NoAssistantTurnError,
    TrainingDataError,
)

CHAT_EXTENSIONS = (".jsonl", ".json")
TEXT_EXTENSIONS = (".txt", ".text", ".md")
ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "system": "system",
}
# A message lists at most this many files of a directory, and quotes at most this many characters of a record.
MAX_LISTED = 5
MAX_QUOTED = 80
SKIP_NO_ASSISTANT = "no assistant turn"
SKIP_MALFORMED = "malformed conversation"
SKIP_UNKNOWN_ROLE = "unknown role"
SKIP_TEMPLATE_NOT_PREFIX = "chat template does not render prefixes as prefixes"
SKIP_TRUNCATED_AWAY = "all response tokens beyond max_length"
SKIP_TOO_SHORT = "too short to give any head a target"


@dataclass
class Sample:
    """One training sequence: token ids and which of them are training targets."""

    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T] bool


@dataclass
class DataStats:
    path: str
    kind: str = ""
    records: int = 0
    samples: int = 0
    train_samples: int = 0
    eval_samples: int = 0
    truncated: int = 0
    tokens: int = 0
    response_tokens: int = 0
    skipped: dict = field(default_factory=dict)

    def describe(self) -> str:
        skipped = ", ".join(f"{n} ({reason})" for reason, n in sorted(self.skipped.items())) or "none"
        return (
            f"data {self.path}: {self.records} {self.kind} records -> {self.samples} sequences "
            f"({self.train_samples} train / {self.eval_samples} held-out), {self.tokens} tokens of which "
            f"{self.response_tokens} are targets; truncated to max_length: {self.truncated}; skipped: {skipped}"
        )


@dataclass
class TokenizedData:
    train: list[Sample]
    eval: list[Sample]
    stats: DataStats


# -- reading ------------------------------------------------------------------------------------


def read_records(path: str | Path, data_format: str = "auto"):
    """Load the file with ``datasets``; return (kind, dataset) with kind "chat" or "text"."""
    require_extra("datasets", "Reading training data")
    import datasets

    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix.lower() in CHAT_EXTENSIONS + TEXT_EXTENSIONS)
        listed = ", ".join(inside[:MAX_LISTED]) + (", ..." if len(inside) > MAX_LISTED else "")
        found = f" (it holds {listed})" if inside else ""
        raise TrainingDataError(
            f"data path {path} is a directory{found}; give the data file(s) inside it, e.g. data: [{path}/train.jsonl]"
        )
    if not path.is_file():
        raise TrainingDataError(f"data file {path} does not exist")
    if path.stat().st_size == 0:
        raise EmptyDatasetError(f"data file {path} is empty: no records to train on")
    if path.suffix.lower() in CHAT_EXTENSIONS:
        check_json_records(path)
    suffix = path.suffix.lower()
    try:
        if suffix in CHAT_EXTENSIONS:
            dataset = datasets.load_dataset("json", data_files=str(path), split="train")
        elif suffix in TEXT_EXTENSIONS:
            dataset = datasets.load_dataset("text", data_files=str(path), sample_by="paragraph", split="train")
        else:
            raise TrainingDataError(
                f"data file {path}: unknown extension {suffix!r}; use one of {CHAT_EXTENSIONS + TEXT_EXTENSIONS}"
            )
    except TrainingDataError:
        raise
    except Exception as error:  # datasets raises many kinds (schema mismatch, JSON errors...)
        raise TrainingDataError(
            f"data file {path} could not be read by datasets: {type(error).__name__}: {error}"
        ) from error
    if len(dataset) == 0:
        raise EmptyDatasetError(f"data file {path} holds no records")
    columns = set(dataset.column_names)
    if "conversations" in columns or "messages" in columns:
        kind = "chat"
    elif "text" in columns:
        kind = "text"
    else:
        raise TrainingDataError(
            f"data file {path}: records have fields {sorted(columns)}; expected 'conversations' (ShareGPT), "
            "'messages' (role/content) or 'text'"
        )
    if data_format != "auto" and data_format != kind:
        raise TrainingDataError(f"data file {path} holds {kind} records but data_format is {data_format!r}")
    return kind, dataset


def check_json_records(path: Path) -> None:
    """The JSON schema of a data file: a list of objects, or JSON lines of one object each.

    A problem is reported with the line (or the record) it is on, before ``datasets`` reads the
    file (whose own error names neither).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise TrainingDataError(f"data file {path} is not UTF-8 text ({error}); save it as UTF-8") from error
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        if text.lstrip().startswith("["):  # meant as one JSON list of records
            raise TrainingDataError(
                f"data file {path}, line {error.lineno}: not valid JSON ({error.msg} at column {error.colno}); "
                "the file must be one JSON list of records, or one JSON record per line"
            ) from error
        document = None  # JSON lines, checked line by line below
    if isinstance(document, list):
        if not document:
            raise EmptyDatasetError(f"data file {path} holds an empty list: no records to train on")
        records = [(f"record {i}", record) for i, record in enumerate(document, start=1)]
    else:
        records = list(json_lines(path, text))
        if not records:
            raise EmptyDatasetError(f"data file {path} holds only blank lines: no records to train on")
    for where, record in records:
        if not isinstance(record, dict) or not record:
            raise TrainingDataError(
                f"data file {path}, {where}: expected a JSON object such as "
                f'{{"messages": [...]}} or {{"text": ...}}, '
                f"got {json.dumps(record)[:MAX_QUOTED]}"
            )


def json_lines(path: Path, text: str):
    """(``line N``, record) for each non-blank line; the first line that is not JSON is an error naming it."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"line {number}", json.loads(line)
        except json.JSONDecodeError as error:
            raise TrainingDataError(
                f"data file {path}, line {number}: not valid JSON ({error.msg} at column {error.colno}); "
                "each line must be one JSON record: fix or remove that line"
            ) from error


def normalise_conversation(record: dict) -> tuple[list[dict] | None, str | None]:
    """A record -> ([{"role", "content"}...], None), or (None, reason to skip it)."""
    turns = record.get("conversations") or record.get("messages")
    if not isinstance(turns, list) or not turns:
        return None, SKIP_MALFORMED
    messages = []
    for turn in turns:
        if not isinstance(turn, dict):
            return None, SKIP_MALFORMED
        role = turn.get("from", turn.get("role"))
        content = turn.get("value", turn.get("content"))
        if not isinstance(role, str) or not isinstance(content, str):
            return None, SKIP_MALFORMED
        if role.lower() not in ROLE_ALIASES:
            return None, f"{SKIP_UNKNOWN_ROLE} {role!r}"
        messages.append({"role": ROLE_ALIASES[role.lower()], "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        return None, SKIP_NO_ASSISTANT
    return messages, None


# -- tokenising ---------------------------------------------------------------------------------


def check_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise MissingChatTemplateError(
            f"tokenizer {name!r} has no chat template, so conversations cannot be rendered; "
            "set tokenizer.chat_template, use an instruct model's tokenizer, or train on plain text (a .txt file)"
        )
    if not getattr(tokenizer, "is_fast", False):
        raise TrainingDataError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} is not a fast tokenizer; response masking "
            "needs offsets"
        )


def response_char_spans(messages: list[dict], tokenizer) -> tuple[str, list[tuple[int, int]]] | None:
    """Render the conversation; return (text, [(start, end) of each assistant response])."""

    def render(prefix: list[dict], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(prefix, tokenize=False, add_generation_prompt=generation_prompt)

    text = render(messages, False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render(messages[:i], True) if i else render_generation_prompt_only(tokenizer)
        after = render(messages[: i + 1], False)
        if not (after.startswith(before) and text.startswith(after)):
            return None
        end = len(before) + len(after[len(before) :].rstrip())  # drop the newline after the end-of-turn marker
        spans.append((len(before), end))
    return text, spans


def render_generation_prompt_only(tokenizer) -> str:
    """An assistant turn first in a conversation: the template's text before it (often nothing)."""
    try:
        return tokenizer.apply_chat_template([], tokenize=False, add_generation_prompt=True)
    except Exception:  # some templates refuse an empty conversation
        return ""


def mask_from_spans(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """A token is a target when its characters lie inside a response span."""
    mask = []
    for start, end in offsets:
        mask.append(end > start and any(start >= s and end <= e for s, e in spans))
    return mask


def tokenize_conversation(messages: list[dict], tokenizer) -> tuple[list[int], list[bool]] | None:
    rendered = response_char_spans(messages, tokenizer)
    if rendered is None:
        return None
    text, spans = rendered
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoding["input_ids"]), mask_from_spans(encoding["offset_mapping"], spans)


def has_head_target(loss_mask: list[bool]) -> bool:
    """Head 1 at position n predicts token n+2: some target must sit at index >= 2."""
    return any(loss_mask[2:])


def tokenize_chat_records(dataset, tokenizer, max_length: int, stats: DataStats) -> list[Sample]:
    check_chat_template(tokenizer)
    skipped: collections.Counter = collections.Counter()
    samples = []
    for record in dataset:
        messages, reason = normalise_conversation(record)
        tokens = tokenize_conversation(messages, tokenizer) if messages is not None else None
        if messages is not None and tokens is None:
            reason = SKIP_TEMPLATE_NOT_PREFIX
        if tokens is None:
            skipped[reason] += 1
            continue
        ids, mask = tokens
        if len(ids) > max_length:
            stats.truncated += 1
            ids, mask = ids[:max_length], mask[:max_length]
            if not any(mask):
                skipped[SKIP_TRUNCATED_AWAY] += 1
                continue
        if not has_head_target(mask):
            skipped[SKIP_TOO_SHORT] += 1
            continue
        samples.append(Sample(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool)))
    stats.skipped = dict(skipped)
    if not samples and skipped and set(skipped) == {SKIP_NO_ASSISTANT}:
        raise NoAssistantTurnError(
            f"data file {stats.path}: none of its {stats.records} conversations has an assistant turn "
            "(roles 'gpt'/'assistant'); there is nothing to train the heads on"
        )
    return samples


def tokenize_text_records(dataset, tokenizer, max_length: int, stats: DataStats) -> list[Sample]:
    """Pack all documents (each ended by EOS when the tokenizer has one) into max_length blocks."""
    stream: list[int] = []
    eos = tokenizer.eos_token_id
    for record in dataset:
        text = record.get("text")
        if not isinstance(text, str) or not text.strip():
            continue
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if eos is not None:
            stream.append(eos)
    samples = []
    for start in range(0, len(stream), max_length):
        block = stream[start : start + max_length]
        if len(block) >= 3:
            samples.append(Sample(torch.tensor(block, dtype=torch.long), torch.ones(len(block), dtype=torch.bool)))
    return samples


def split_held_out(samples: list[Sample], eval_fraction: float, seed: int) -> tuple[list[Sample], list[Sample]]:
    """A deterministic shuffle, then the last ``eval_fraction`` (at least one) is held out."""
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    if eval_fraction <= 0:
        return [samples[i] for i in order], []
    if len(samples) < 2:
        raise EmptyDatasetError(
            f"only {len(samples)} usable sequence(s): need at least 2 to hold one out for evaluation (or set "
            "eval_fraction: 0)"
        )
    num_eval = min(len(samples) - 1, max(1, round(eval_fraction * len(samples))))
    return [samples[i] for i in order[:-num_eval]], [samples[i] for i in order[-num_eval:]]


def tokenize_file(path: str | Path, tokenizer, max_length: int, data_format: str) -> tuple[list[Sample], DataStats]:
    """One data file's training sequences and its statistics."""
    kind, dataset = read_records(path, data_format)
    stats = DataStats(path=str(path), kind=kind, records=len(dataset))
    tokenize = tokenize_chat_records if kind == "chat" else tokenize_text_records
    return tokenize(dataset, tokenizer, max_length, stats), stats


def combined_stats(parts: Sequence[DataStats]) -> DataStats:
    """The statistics of several files read as one data set (paths joined by " + ")."""
    skipped: collections.Counter = collections.Counter()
    for part in parts:
        skipped.update(part.skipped)
    return DataStats(
        path=" + ".join(part.path for part in parts),
        kind="/".join(sorted({part.kind for part in parts})),
        records=sum(part.records for part in parts),
        truncated=sum(part.truncated for part in parts),
        skipped=dict(skipped),
    )


def load_training_data(
    data: str | Path | Sequence[str | Path],
    tokenizer,
    *,
    max_length: int,
    eval_fraction: float,
    seed: int,
    data_format: str = "auto",
) -> TokenizedData:
    """Tokenise one data file or several (their sequences pooled), then hold some out."""
    paths = [data] if isinstance(data, (str, Path)) else list(data)
    if not paths:
        raise TrainingDataError("no data file given")
    samples: list[Sample] = []
    parts = []
    for path in paths:
        file_samples, file_stats = tokenize_file(path, tokenizer, max_length, data_format)
        samples += file_samples
        parts.append(file_stats)
    stats = combined_stats(parts)
    if not samples:
        raise EmptyDatasetError(
            f"data file {stats.path}: no usable sequence among {stats.records} records ({stats.describe()})"
        )
    train, held_out = split_held_out(samples, eval_fraction, seed)
    stats.samples = len(samples)
    stats.train_samples, stats.eval_samples = len(train), len(held_out)
    stats.tokens = sum(int(s.input_ids.numel()) for s in samples)
    stats.response_tokens = sum(int(s.loss_mask.sum()) for s in samples)
    return TokenizedData(train=train, eval=held_out, stats=stats)


# -- batching -----------------------------------------------------------------------------------


def collate(samples: list[Sample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence; padding is never a target."""
    length = max(int(s.input_ids.numel()) for s in samples)
    input_ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(samples), length), dtype=torch.bool)
    attention_mask = torch.zeros((len(samples), length), dtype=torch.long)
    for row, sample in enumerate(samples):
        n = int(sample.input_ids.numel())
        input_ids[row, :n] = sample.input_ids
        loss_mask[row, :n] = sample.loss_mask
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "loss_mask": loss_mask, "attention_mask": attention_mask}


def epoch_order(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The sample order of one epoch: a function of (seed, epoch) only, so a resumed run sees the same."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_samples, generator=generator).tolist()


def batch_indices(step: int, *, num_samples: int, batch_size: int, rank: int, world_size: int, seed: int) -> list[int]:
    """The sample indices this rank trains on at ``step`` (0-based).

    A step consumes ``batch_size * world_size`` samples of the epoch's order; rank r takes the
    r-th slice, so ranks see different data. The incomplete tail of an epoch is dropped.
    """
    per_step = batch_size * world_size
    steps_per_epoch = num_samples // per_step
    epoch, position = divmod(step, steps_per_epoch)
    order = epoch_order(num_samples, seed, epoch)
    start = position * per_step + rank * batch_size
    return order[start : start + batch_size]
