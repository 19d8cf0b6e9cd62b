"""A head-training set from the target model itself, with no external data (``medusa-lite distill``).

1. Questions, Magpie-style: the model is fed only its chat template's system turn and the
   opening of a user turn (for SmolLM2 ``<|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\n``,
   derived from the tokenizer's chat template) and writes a user question, sampled at T=1.0,
   top-p 0.95, until its end-of-turn token. Empty, truncated, repetitive or duplicate questions
   are re-sampled (a few attempts per record).
   With ``--task-openers``, record i's user turn starts with opener ``i mod len(openers)`` (e.g.
   "Summarize the following text:") and the model writes the rest of the message itself (the
   text to summarize, translate, answer from...): the questions then cover task types a
   free-running model rarely asks for (the heads trained on plain Magpie questions guess much
   worse on task-style prompts). ``--task-openers default`` uses :data:`TASK_OPENERS`, a generic
   instruction-type list (Dolly/Alpaca-style categories, written here, not taken from any
   benchmark); a file gives one opener per line.
2. Answers: the target's own response to each question (greedy by default), up to
   ``--max-new-tokens``, generated in batches with left padding.

Output: JSONL, one ShareGPT-style record per line::

    {"id": 0, "source": "self-distill", "truncated": false,
     "conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}

Resumable: records are appended batch by batch; a restart keeps the records already written
(dropping a torn last line) and continues. Every record's randomness comes from its own seed,
derived from ``--seed`` and the record's index, and batch ``b`` always holds records
``[b*batch_size, (b+1)*batch_size)``, so an interrupted and resumed run writes the same records
as an uninterrupted one (keep ``--batch-size`` unchanged across restarts for bit-identity).

This module NEVER uses the Spec-Bench questions (``medusa_lite/bench/spec_bench/``) or any other
dataset: Spec-Bench is our benchmark, and training heads on it would leak the test set.

Usage: ``medusa-lite distill --help`` (:mod:`medusa_lite.commands.distill`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

SOURCE_TAG = "self-distill"
HUMAN_ROLE, GPT_ROLE = "human", "gpt"
USER_SENTINEL = "MEDUSA_LITE_USER_SENTINEL_7f3a"

QUESTION_TEMPERATURE = 1.0
QUESTION_TOP_P = 0.95
MAX_QUESTION_ATTEMPTS = 8
MIN_QUESTION_WORDS = 3
MIN_UNIQUE_WORD_RATIO = 0.5
UNICODE_REPLACEMENT_CHAR = "\ufffd"

QUESTION_STREAM = 0
RESPONSE_STREAM = 1
GREEDY_TEMPERATURE = 0.0

DEFAULT_BATCH_SIZE = 16
DEFAULT_MAX_PROMPT_TOKENS = 96
DEFAULT_MAX_NEW_TOKENS = 192
DEFAULT_SEED = 0
DEFAULT_RESPONSE_TOP_P = 1.0
SETTINGS_SUFFIX = ".settings.json"
# Generic instruction types for --task-openers default; the model writes the rest of the message.
TASK_OPENERS = (
    "Summarize the following text in a few sentences:\n\n",
    "Translate the following text into English:\n\n",
    "Read the passage below and answer the question at the end.\n\nPassage: ",
    "Extract the names, dates and numbers mentioned in this text:\n\n",
    "Solve this math word problem step by step: ",
    "Write a short story about ",
    "Explain in simple terms how ",
    "Rewrite the following paragraph to make it clearer:\n\n",
    "Write a Python function that ",
    "Give three arguments for and against ",
    "You are a tour guide. Describe ",
    "Answer briefly: ",
)


@dataclass(frozen=True)
class DistillSettings:
    """Everything that determines the records (besides the model)."""

    batch_size: int = DEFAULT_BATCH_SIZE
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = DEFAULT_SEED
    response_temperature: float = GREEDY_TEMPERATURE
    response_top_p: float = DEFAULT_RESPONSE_TOP_P
    task_openers: tuple[str, ...] = ()  # empty: plain Magpie questions


def opener_for(index: int, openers: tuple[str, ...]) -> str:
    """The text record ``index``'s user turn starts with ("" without openers): openers in turn."""
    return openers[index % len(openers)] if openers else ""


@dataclass
class Generated:
    """One generated continuation: its tokens before the stop token, and whether it stopped."""

    tokens: list[int]
    finished: bool


# ---------------------------------------------------------------- chat template


def user_turn_prefix(tokenizer) -> str:
    """The text a chat opens with, up to where the first user message's content starts.

    Rendered from the tokenizer's own chat template (default system turn included, if the
    template adds one) with a sentinel user message, cut at the sentinel.
    """
    rendered = render_user_turn(tokenizer)
    return rendered[: rendered.index(USER_SENTINEL)]


def user_turn_suffix(tokenizer) -> str:
    """The text the chat template puts right after a user message's content."""
    rendered = render_user_turn(tokenizer)
    return rendered[rendered.index(USER_SENTINEL) + len(USER_SENTINEL) :]


def render_user_turn(tokenizer) -> str:
    """A one-message chat with a sentinel user message, rendered by the chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("self-distillation needs a tokenizer with a chat template; this one has none")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": USER_SENTINEL}], tokenize=False)
    if rendered.count(USER_SENTINEL) != 1:
        raise ValueError("the chat template does not render the user message verbatim exactly once")
    return rendered


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids that end a turn: the first token after a message (e.g. ``<|im_end|>``) and EOS."""
    suffix_ids = tokenizer(user_turn_suffix(tokenizer), add_special_tokens=False).input_ids
    candidates = suffix_ids[:1] + [tokenizer.eos_token_id]
    return list(dict.fromkeys(token for token in candidates if token is not None))


def chat_prompt_ids(tokenizer, question: str) -> list[int]:
    """Token ids of a chat holding ``question`` as the user turn, ready for the assistant."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer(text, add_special_tokens=False).input_ids


# ---------------------------------------------------------------- seeded sampling


def record_seed(seed: int, index: int, attempt: int, stream: int) -> int:
    """A 63-bit seed for one random draw sequence of one record, independent of batching."""
    state = np.random.SeedSequence([seed, index, attempt, stream]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def seeded_generators(seeds: list[int], device: torch.device) -> list[torch.Generator]:
    """One ``torch.Generator`` per seed, on ``device``."""
    return [torch.Generator(device=device).manual_seed(seed) for seed in seeds]


def nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Softmax at ``temperature`` restricted to the smallest top set holding ``top_p`` of the mass."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


class PerRowSampler(LogitsProcessor):
    """Samples each row with its own generator and returns logits that force that token.

    Used with greedy ``generate`` so that row ``i``'s ``t``-th token depends only on its own
    seed, whatever else is in the batch.
    """

    def __init__(self, generators: list[torch.Generator], temperature: float, top_p: float):
        self.generators = generators
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = nucleus_probs(scores, self.temperature, self.top_p)
        chosen = torch.cat(
            [torch.multinomial(row, 1, generator=generator) for row, generator in zip(probs, self.generators)]
        )
        forced = torch.full_like(scores, torch.finfo(scores.dtype).min)
        return forced.scatter(-1, chosen.unsqueeze(-1), 0.0)


# ---------------------------------------------------------------- batched generation


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` for ``sequences`` padded on the left."""
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, width - len(sequence) :] = 1
    return input_ids, attention_mask


def cut_at_stop(tokens: list[int], stop_ids: list[int]) -> Generated:
    """The tokens before the first stop token, and whether a stop token was produced."""
    for position, token in enumerate(tokens):
        if token in stop_ids:
            return Generated(tokens=tokens[:position], finished=True)
    return Generated(tokens=tokens, finished=False)


@torch.no_grad()
def generate_batch(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    sampler: PerRowSampler | None = None,
) -> list[Generated]:
    """Continue every prompt (left-padded into one batch): greedy, or sampled by ``sampler``."""
    input_ids, attention_mask = left_pad(prompts, pad_id)
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stop_ids, pad_token_id=pad_id
    )
    output = model.generate(
        input_ids=input_ids.to(model.device),
        attention_mask=attention_mask.to(model.device),
        generation_config=config,
        logits_processor=LogitsProcessorList([sampler] if sampler is not None else []),
    )
    new_tokens = output[:, input_ids.shape[1] :].tolist()
    return [cut_at_stop(row, stop_ids) for row in new_tokens]


def pad_token_id(tokenizer, stop_ids: list[int]) -> int:
    """The tokenizer's pad token, else the first stop token (only ever masked out)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]


# ---------------------------------------------------------------- questions


def normalize_question(text: str) -> str:
    """Lower-case, whitespace-collapsed form used to detect duplicates."""
    return " ".join(text.lower().split())


def is_acceptable_question(text: str) -> bool:
    """False for empty, too short, repetitive or mis-decoded questions."""
    words = text.split()
    if len(words) < MIN_QUESTION_WORDS or UNICODE_REPLACEMENT_CHAR in text:
        return False
    unique_ratio = len({word.lower() for word in words}) / len(words)
    return unique_ratio >= MIN_UNIQUE_WORD_RATIO


def sample_questions(
    model, tokenizer, indices: list[int], settings: DistillSettings, seen: set[str]
) -> dict[int, str]:
    """A fresh question for each record index (fewer if all attempts fail), in index order.

    Attempt ``a`` for record ``i`` is drawn with seed ``(seed, i, a)``; accepted questions are
    added to ``seen`` so later ones are not duplicates.
    """
    stop_ids = end_of_turn_ids(tokenizer)
    special_ids = set(tokenizer.all_special_ids)
    prefix = user_turn_prefix(tokenizer)
    openers = {index: opener_for(index, settings.task_openers) for index in indices}
    prefix_ids = {index: tokenizer(prefix + openers[index], add_special_tokens=False).input_ids for index in indices}
    questions: dict[int, str] = {}
    pending = list(indices)
    for attempt in range(MAX_QUESTION_ATTEMPTS):
        if not pending:
            break
        seeds = [record_seed(settings.seed, index, attempt, QUESTION_STREAM) for index in pending]
        sampler = PerRowSampler(seeded_generators(seeds, model.device), QUESTION_TEMPERATURE, QUESTION_TOP_P)
        outputs = generate_batch(
            model,
            [prefix_ids[index] for index in pending],
            settings.max_prompt_tokens,
            stop_ids,
            pad_token_id(tokenizer, stop_ids),
            sampler,
        )
        still_pending = []
        for index, output in zip(pending, outputs):
            text = (openers[index] + tokenizer.decode(output.tokens)).strip()
            key = normalize_question(text)
            usable = output.finished and not special_ids.intersection(output.tokens)
            if usable and is_acceptable_question(text) and key not in seen:
                questions[index] = text
                seen.add(key)
            else:
                still_pending.append(index)
        pending = still_pending
    return dict(sorted(questions.items()))


# ---------------------------------------------------------------- answers and records


def answer_questions(model, tokenizer, questions: dict[int, str], settings: DistillSettings) -> dict[int, Generated]:
    """The target's own response to each question, greedy unless ``response_temperature > 0``."""
    stop_ids = end_of_turn_ids(tokenizer)
    indices = list(questions)
    sampler = None
    if settings.response_temperature > GREEDY_TEMPERATURE:
        seeds = [record_seed(settings.seed, index, 0, RESPONSE_STREAM) for index in indices]
        generators = seeded_generators(seeds, model.device)
        sampler = PerRowSampler(generators, settings.response_temperature, settings.response_top_p)
    prompts = [chat_prompt_ids(tokenizer, questions[index]) for index in indices]
    outputs = generate_batch(
        model, prompts, settings.max_new_tokens, stop_ids, pad_token_id(tokenizer, stop_ids), sampler
    )
    return dict(zip(indices, outputs))


def make_record(index: int, question: str, answer: str, truncated: bool) -> dict:
    """One ShareGPT-style JSONL record."""
    return {
        "id": index,
        "source": SOURCE_TAG,
        "truncated": truncated,
        "conversations": [{"from": HUMAN_ROLE, "value": question}, {"from": GPT_ROLE, "value": answer}],
    }


@dataclass
class BatchOutput:
    """The records of one batch, their response lengths in tokens, and time spent per phase."""

    records: list[dict]
    response_lengths: dict[int, int]
    question_seconds: float
    answer_seconds: float


def distill_batch(model, tokenizer, batch_index: int, settings: DistillSettings, seen: set[str]) -> BatchOutput:
    """The records of batch ``batch_index``: indices ``[b*batch_size, (b+1)*batch_size)``."""
    start = batch_index * settings.batch_size
    indices = list(range(start, start + settings.batch_size))
    started = time.perf_counter()
    questions = sample_questions(model, tokenizer, indices, settings, seen)
    questions_done = time.perf_counter()
    answers = answer_questions(model, tokenizer, questions, settings) if questions else {}
    records = [
        make_record(
            index,
            questions[index],
            tokenizer.decode(answer.tokens, skip_special_tokens=True),
            truncated=not answer.finished,
        )
        for index, answer in answers.items()
    ]
    return BatchOutput(
        records=records,
        response_lengths={index: len(answer.tokens) for index, answer in answers.items()},
        question_seconds=questions_done - started,
        answer_seconds=time.perf_counter() - questions_done,
    )


# ---------------------------------------------------------------- resumable output


def read_records(path: Path) -> list[dict]:
    """Complete records already in ``path``; a torn last line (killed mid-write) is removed."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete_length = data.rfind(b"\n") + 1
    if complete_length < len(data):
        with path.open("r+b") as handle:
            handle.truncate(complete_length)
    lines = data[:complete_length].decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def append_records(path: Path, records: list[dict]) -> None:
    """Append records as JSON lines and flush them to disk."""
    if not records:
        return
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))
        handle.flush()
        os.fsync(handle.fileno())


def check_settings_file(path: Path, run_settings: dict) -> None:
    """Record the settings next to the output; refuse to resume a file made with other ones."""
    settings_path = path.with_name(path.name + SETTINGS_SUFFIX)
    if settings_path.exists():
        stored = json.loads(settings_path.read_text())
        if stored != run_settings:
            raise SystemExit(
                f"{path} was started with other settings ({settings_path}):\n  {stored}\n"
                f"now:\n  {run_settings}\nUse the same settings to resume, or another --out."
            )
        return
    settings_path.write_text(json.dumps(run_settings, indent=2) + "\n")


def run_distillation(model, tokenizer, out: Path, num_samples: int, settings: DistillSettings) -> dict:
    """Write records ``0..num_samples-1`` to ``out``, continuing after any already there.

    Returns throughput counters for the work done in this call.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    existing = read_records(out)
    next_index = existing[-1]["id"] + 1 if existing else 0
    stats = {"records": 0, "response_tokens": 0, "question_seconds": 0.0, "answer_seconds": 0.0, "seconds": 0.0}
    progress = tqdm(total=num_samples, initial=min(next_index, num_samples), unit="sample", desc="self-distill")
    started = time.perf_counter()
    while next_index < num_samples:
        batch_index = next_index // settings.batch_size
        batch_start = batch_index * settings.batch_size
        seen = {normalize_question(r["conversations"][0]["value"]) for r in existing if r["id"] < batch_start}
        batch = distill_batch(model, tokenizer, batch_index, settings, seen)
        new_records = [r for r in batch.records if next_index <= r["id"] < num_samples]
        append_records(out, new_records)
        existing.extend(new_records)
        stats["records"] += len(new_records)
        stats["response_tokens"] += sum(batch.response_lengths[r["id"]] for r in new_records)
        stats["question_seconds"] += batch.question_seconds
        stats["answer_seconds"] += batch.answer_seconds
        stats["seconds"] = time.perf_counter() - started
        batch_end = min(batch_start + settings.batch_size, num_samples)
        progress.update(batch_end - next_index)
        progress.set_postfix(records=len(existing), resp_tok_s=f"{stats['response_tokens'] / stats['seconds']:.0f}")
        next_index = batch_end
    progress.close()
    return stats
