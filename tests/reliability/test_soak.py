"""The soak (``make soak``; marked ``soak``, not part of ``make test``): one process serving many requests for minutes
from several threads on one loaded default model (SmolLM2-135M-Instruct with its shipped heads, fp32).

Requests are drawn at random, with a fixed seed, from a mix of what a server meets: greedy on each proposer set
(the default, the heads alone, prompt lookup alone, Lookahead), greedy batches, stop tokens, sampling (``top_k=1``,
which must equal greedy, and free sampling, which must stay in the vocabulary and the budget), cancellations (a
streamer that raises mid-answer) and bad requests (each must raise a :class:`~medusa_lite.errors.MedusaError`).
Every greedy answer is compared with the target's own greedy ``generate`` of the same prompt, computed before the
soak starts. Resident memory is sampled every second and the live Python objects every ten; after the warm-up the
least-squares slopes of each minute's lowest sample must stay under ``MAX_RESIDENT_SLOPE_MIB_PER_MINUTE`` and
``MAX_OBJECT_SLOPE_PER_MINUTE``. No request may take longer than ``MAX_REQUEST_SECONDS`` and every thread must end.

``SOAK_MINUTES`` (default 10) sets the length, ``SOAK_THREADS`` (default 4) the threads, and ``SOAK_REPORT`` a JSON
file for the figures (``make soak`` writes ``benchmarks/soak/results.json``).
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import statistics
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from medusa_lite import LookaheadProposer, MedusaError, PromptLookup, generate, load
from medusa_lite.bench.measure import chat_input_ids, left_padded, machine_info
from medusa_lite.bench.questions import DEFAULT_QUESTIONS, read_questions, stratified_subset

pytestmark = pytest.mark.soak

MINUTES = float(os.environ.get("SOAK_MINUTES", "10"))
THREADS = int(os.environ.get("SOAK_THREADS", "4"))
REPORT = os.environ.get("SOAK_REPORT")
SEED = 0
PROMPTS = 8  # stratified Spec-Bench questions: the pool every request draws from
LONGEST_ANSWER = 48  # new tokens of the reference answers; a request asks for at most this many
WARM_UP_SHARE = 0.25  # the first quarter of the soak is warm-up: the memory slope is fitted over the rest
FLOOR_WINDOW_S = 60.0  # a slope is fitted to each minute's lowest sample
# A leak of one KV cache of an answer a request (about 14 MiB here) would grow resident memory by hundreds of MiB a
# minute, one small tensor a request (~100 KiB) by ~5; the allocator's own drift seen here is 2-4 (a 12-minute run).
MAX_RESIDENT_SLOPE_MIB_PER_MINUTE = 5.0
# One Python object kept per request would add ~50 a minute at this rate.
MAX_OBJECT_SLOPE_PER_MINUTE = 25.0
MAX_REQUEST_SECONDS = 120.0
MEMORY_SAMPLE_SECONDS = 1.0
OBJECT_COUNT_EVERY = 10  # memory samples between two counts of the live Python objects
BATCH_ROWS = (2, 3)
KINDS = ("greedy", "batch", "stop", "top_k_1", "sampling", "cancel", "bad")


class Cancelled(Exception):
    """What the cancelling streamer raises: the request ends, the thread goes on serving."""


class CancellingStreamer:
    """A streamer that raises after ``after`` calls, as a client hanging up mid-answer would."""

    def __init__(self, after: int):
        self.calls, self.after = 0, after

    def put(self, value) -> None:
        self.calls += 1
        if self.calls > self.after:
            raise Cancelled

    def end(self) -> None:
        pass


@dataclass
class Tally:
    """What the threads saw, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    kinds: Counter = field(default_factory=Counter)
    proposer_sets: Counter = field(default_factory=Counter)
    greedy_checked: int = 0
    greedy_identical: int = 0
    failures: list[str] = field(default_factory=list)
    longest_request_s: float = 0.0
    new_tokens: int = 0

    def add(self, kind: str, seconds: float, new_tokens: int = 0) -> None:
        with self.lock:
            self.kinds[kind] += 1
            self.longest_request_s = max(self.longest_request_s, seconds)
            self.new_tokens += new_tokens

    def greedy(self, identical: bool, what: str) -> None:
        with self.lock:
            self.greedy_checked += 1
            self.greedy_identical += identical
            if not identical:
                self.failures.append(f"not identical to plain greedy: {what}")

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


def resident_mib() -> float:
    """This process's resident memory (MiB), from /proc."""
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass
class Series:
    """(seconds, value) samples, kept in arrays: taking them adds no Python objects to the count they track."""

    seconds: array = field(default_factory=lambda: array("d"))
    values: array = field(default_factory=lambda: array("d"))

    def add(self, seconds: float, value: float) -> None:
        self.seconds.append(seconds)
        self.values.append(value)

    def floors(self, after_s: float) -> list[tuple[float, float]]:
        """(window start, lowest value) of each whole ``FLOOR_WINDOW_S`` window after ``after_s``: what stays
        when the requests in flight have let go of what they held."""
        windows: dict[int, float] = {}
        for t, value in zip(self.seconds, self.values):
            if t >= after_s:
                window = int((t - after_s) // FLOOR_WINDOW_S)
                windows[window] = min(value, windows.get(window, math.inf))
        last = int((self.seconds[-1] - after_s) // FLOOR_WINDOW_S) if self.seconds else -1
        return [(after_s + w * FLOOR_WINDOW_S, v) for w, v in sorted(windows.items()) if w < last]

    def slope_per_minute(self, after_s: float) -> float | None:
        """Least-squares slope (per minute) of the window floors after the warm-up; None with under two."""
        floors = self.floors(after_s)
        if len(floors) < 2:
            return None
        slope, _ = statistics.linear_regression([t for t, _ in floors], [v for _, v in floors])
        return slope * 60


def expected_with_stop(reference: torch.Tensor, stop: int, new_tokens: int) -> torch.Tensor:
    """The reference answer cut at the first ``stop`` token (kept), within ``new_tokens``."""
    answer = reference[:new_tokens]
    hits = (answer == stop).nonzero()
    return answer[: int(hits[0]) + 1] if hits.numel() else answer


def proposer_sets(model, tokenizer) -> dict[str, dict]:
    """``generate``'s arguments for each proposer set a request may use."""
    return {
        "default": {},
        "heads_only": {"lookup_tokens": 0, "datastore": False},
        "prompt_lookup": {"proposers": [PromptLookup()]},
        "lookahead": {"proposers": [LookaheadProposer()]},
    }


def bad_requests(model, prompt: torch.Tensor) -> list[dict]:
    """Requests every one of which must end in a MedusaError before any decoding."""
    return [
        {"input_ids": prompt, "max_new_tokens": -1},
        {"input_ids": prompt, "max_new_tokens": 8, "temperature": -1.0},
        {"input_ids": prompt, "max_new_tokens": 8, "top_p": 1.5},
        {"input_ids": torch.tensor([[model.vocab_size + 5]]), "max_new_tokens": 8},
        {"input_ids": torch.zeros(1, 0, dtype=torch.long), "max_new_tokens": 8},
        {"input_ids": prompt, "max_new_tokens": 8, "lookup_tokens": 0, "proposers": [PromptLookup()]},
    ]


def serve_one(rng: random.Random, model, prompts, references, sets, tally: Tally, pad: int) -> None:
    """Draw one request, run it, check its answer."""
    kind = rng.choice(KINDS)
    index = rng.randrange(len(prompts))
    prompt, reference = prompts[index], references[index]
    new_tokens = rng.randint(8, LONGEST_ANSWER)
    set_name = rng.choice(list(sets))
    arguments = sets[set_name]
    started = time.perf_counter()
    produced = 0
    if kind == "greedy":
        out = generate(model, prompt[None], new_tokens, **arguments)
        answer = out.sequences[0, prompt.numel() :]
        tally.greedy(torch.equal(answer, reference[:new_tokens]), f"prompt {index}, {new_tokens} tokens, {set_name}")
        produced = answer.numel()
    elif kind == "batch":
        rows = rng.sample(range(len(prompts)), rng.choice(BATCH_ROWS))
        ids, mask = left_padded([prompts[r] for r in rows], pad)
        out = generate(model, ids, new_tokens, attention_mask=mask, pad_token_id=pad, **arguments)
        for b, r in enumerate(rows):
            expected = references[r][:new_tokens]
            row = out.sequences[b, ids.shape[1] : ids.shape[1] + expected.numel()]
            tally.greedy(torch.equal(row, expected), f"batch rows {rows}, row {r}, {new_tokens} tokens, {set_name}")
            produced += expected.numel()
    elif kind == "stop":
        stop = int(reference[rng.randrange(min(new_tokens, reference.numel()))])
        out = generate(model, prompt[None], new_tokens, eos_token_id=stop, **arguments)
        answer = out.sequences[0, prompt.numel() :]
        expected = expected_with_stop(reference, stop, new_tokens)
        tally.greedy(torch.equal(answer, expected), f"prompt {index}, stop token {stop}, {set_name}")
        produced = answer.numel()
    elif kind == "top_k_1":
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        out = generate(model, prompt[None], new_tokens, temperature=0.7, top_k=1, generator=generator, **arguments)
        answer = out.sequences[0, prompt.numel() :]
        tally.greedy(torch.equal(answer, reference[:new_tokens]), f"top_k=1 sampling, prompt {index}, {set_name}")
        produced = answer.numel()
    elif kind == "sampling":
        generator = torch.Generator().manual_seed(rng.randrange(2**31))
        out = generate(model, prompt[None], new_tokens, temperature=0.8, top_p=0.95, generator=generator, **arguments)
        answer = out.sequences[0, prompt.numel() :]
        if not (1 <= answer.numel() <= new_tokens and int(answer.min()) >= 0 and int(answer.max()) < model.vocab_size):
            tally.fail(f"sampling gave {answer.numel()} tokens for {new_tokens} asked, ids {answer.tolist()}")
        produced = answer.numel()
    elif kind == "cancel":
        streamer = CancellingStreamer(after=rng.randint(1, 4))
        try:
            generate(model, prompt[None], new_tokens, streamer=streamer, **arguments)
        except Cancelled:
            pass
        else:
            if streamer.calls > streamer.after:
                tally.fail("a streamer that raised did not end its request")
    else:
        request = rng.choice(bad_requests(model, prompt[None]))
        try:
            generate(model, **request)
        except MedusaError:
            pass
        except Exception as error:  # noqa: BLE001 - the soak reports what a bad request raised instead
            tally.fail(f"bad request {sorted(request)} raised {type(error).__name__}: {error}")
        else:
            tally.fail(f"bad request {sorted(request)} was accepted")
    tally.add(kind, time.perf_counter() - started, produced)
    with tally.lock:
        tally.proposer_sets[set_name] += 1


def test_a_soak_of_mixed_requests_from_threads_on_one_model():
    model, tokenizer = load()
    questions = stratified_subset(read_questions(DEFAULT_QUESTIONS), PROMPTS)
    prompts = [chat_input_ids(tokenizer, q["turns"][0])[0] for q in questions]
    references = [
        model.base_model.generate(
            p[None],
            attention_mask=torch.ones(1, p.numel(), dtype=torch.long),
            max_new_tokens=LONGEST_ANSWER,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )[0, p.numel() :]
        for p in prompts
    ]
    sets = proposer_sets(model, tokenizer)
    pad = tokenizer.pad_token_id
    tally = Tally()
    duration_s = MINUTES * 60
    start = time.perf_counter()
    deadline = start + duration_s
    resident, objects = Series(), Series()  # objects: live Python objects, which a leak of ours would grow
    done = threading.Event()
    heartbeats = [start] * THREADS

    def worker(number: int) -> None:
        rng = random.Random(SEED * 1000 + number)
        while time.perf_counter() < deadline and not tally.failures:
            try:
                serve_one(rng, model, prompts, references, sets, tally, pad)
            except Exception as error:  # noqa: BLE001 - a request that fails is a finding, the thread goes on
                tally.fail(f"thread {number}: {type(error).__name__}: {error}")
            heartbeats[number] = time.perf_counter()

    def sample_memory() -> None:
        while not done.wait(MEMORY_SAMPLE_SECONDS):
            resident.add(time.perf_counter() - start, resident_mib())
            if len(resident.values) % OBJECT_COUNT_EVERY == 0:
                gc.collect()
                objects.add(time.perf_counter() - start, len(gc.get_objects()))

    sampler = threading.Thread(target=sample_memory, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.perf_counter()) + MAX_REQUEST_SECONDS)
    done.set()
    elapsed_s = time.perf_counter() - start
    stuck = [n for n, thread in enumerate(threads) if thread.is_alive()]
    warm_up_s = WARM_UP_SHARE * elapsed_s
    resident_slope, object_slope = resident.slope_per_minute(warm_up_s), objects.slope_per_minute(warm_up_s)
    figures = {
        "machine": machine_info(model.base_model.dtype, model.base_model),
        "minutes": round(elapsed_s / 60, 2),
        "threads": THREADS,
        "requests": sum(tally.kinds.values()),
        "requests_by_kind": dict(sorted(tally.kinds.items())),
        "requests_by_proposer_set": dict(sorted(tally.proposer_sets.items())),
        "new_tokens": tally.new_tokens,
        "greedy_answers_checked": tally.greedy_checked,
        "greedy_identical_share": tally.greedy_identical / max(1, tally.greedy_checked),
        "longest_request_s": round(tally.longest_request_s, 2),
        "warm_up_minutes": round(warm_up_s / 60, 2),
        "resident_mib_floor_per_minute": [round(v, 1) for _, v in resident.floors(0.0)],
        "resident_slope_mib_per_minute": None if resident_slope is None else round(resident_slope, 2),
        "python_objects_floor_per_minute": [int(v) for _, v in objects.floors(0.0)],
        "python_objects_slope_per_minute": None if object_slope is None else round(object_slope, 1),
        "stuck_threads": stuck,
        "failures": tally.failures[:20],
    }
    if REPORT:
        Path(REPORT).parent.mkdir(parents=True, exist_ok=True)
        Path(REPORT).write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    assert not tally.failures, tally.failures[:5]
    assert not stuck, f"threads {stuck} never ended (last heartbeats {heartbeats})"
    assert tally.greedy_checked > 0 and set(tally.kinds) == set(KINDS), tally.kinds
    assert tally.longest_request_s <= MAX_REQUEST_SECONDS
    assert resident_slope is not None and object_slope is not None, "too short a soak to fit a slope"
    assert resident_slope <= MAX_RESIDENT_SLOPE_MIB_PER_MINUTE, f"resident memory grows {resident_slope:.2f} MiB/min"
    assert object_slope <= MAX_OBJECT_SLOPE_PER_MINUTE, f"live Python objects grow {object_slope:.0f}/min"
