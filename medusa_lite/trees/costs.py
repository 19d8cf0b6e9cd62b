"""Step costs measured on the machine that decodes: what verifying r rows costs, in plain decoding steps.

A dynamic tree (:class:`~medusa_lite.trees.dynamic_tree.DynamicTree`) sizes each step by the cost of
the rows it verifies. That cost depends on the CPU (AVX-512 or not), the few-row kernel
(:func:`medusa_lite.cpu.kernels.kernel_path`), the dtype, the thread count, the device and the
model, so it is never taken from another machine's file: the first ``load`` of a dynamic tree
on a new combination measures it (:func:`measure_row_costs`, a few seconds, with a one-line
message on stderr) and caches it in ``<medusa-lite cache>/costs/`` (:func:`cost_cache_path`),
keyed by :func:`cost_key`. ``tree.json`` files keep only what carries over between machines.

The unit is one plain decoding step: a one-token forward of the target over the same cached
prefix, the step ``model.generate`` takes. ``row_costs[r - 1]`` is a verification forward of r
rows (a tree, its attention mask, the cache compaction after it) over that unit, so
``row_costs[0]`` is the overhead of a root-only verification over a plain step.
``proposal_cost``: the model proposer's proposal in the same unit, paid by every step that asks it:
the heads' (all heads, as many guesses as the tree may take), or a sequential drafter's (taking in
the newly committed tokens and drafting its deepest tree,
:func:`medusa_lite.drafters.sequential.proposer.drafter_proposal`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import torch

from medusa_lite.bench.measure import cpu_model
from medusa_lite.cpu.kernels import cpu_capability, kernel_path
from medusa_lite.cpu.prepack import prepack_layout
from medusa_lite.decoding.cache import reserved_cache
from medusa_lite.decoding.model import MedusaModel, TargetOutput, cache_keyword, text_config
from medusa_lite.decoding.verify import keep_accepted_in_cache, verify_tree
from medusa_lite.dtypes import dtype_name
from medusa_lite.paths import cache_root, entry_lock, existing_entry, writable_entry
from medusa_lite.trees.tree import Tree

Cached = TypeVar("Cached")  # what a cache entry holds: step costs, a batch's measured costs

COSTS_FORMAT = "medusa-lite-costs/7"  # /2: heads_cost became proposal_cost; /3: the key's prepack layout; /4: oneDNN;
# /5: the drafter's one-row products packed, and its drafting stopped sooner; /6: the drafter's weights packed in
# bfloat16, its attention grouped (drafting cheaper); /7: few-row verifications cheaper than a plain step kept so
# (they were clamped to 1, every row priced free)
COSTS_FOLDER = "costs"
# Row counts timed; the others take the next larger measured size's cost (never an underestimate).
CALIBRATION_ROWS = (1, 2, 3, 4, 6, 8, 11, 14, 20)
CALIBRATION_PREFIX_TOKENS = 128
CALIBRATION_ROUNDS = 7  # timed rounds at most, each timing every size once in a fresh order
CALIBRATION_MIN_ROUNDS = 3  # timed rounds at least, whatever the time budget
CALIBRATION_BUDGET_S = 4.0  # no new round starts after this many seconds (a busy machine stops early)
CALIBRATION_WARMUP_ROUNDS = 2
CALIBRATION_SEED = 0
NO_NODES = torch.zeros(0, dtype=torch.long)


@dataclass(frozen=True)
class Proposal:
    """What calibration times as the proposer's work per step, and what identifies it in the cache key.

    ``prepare(prefix, prefix_tokens [L], root [1])`` gets the target's output over the calibration
    prefix (an unbatched :class:`~medusa_lite.decoding.model.TargetOutput`: hidden [L, H] and every layer),
    its tokens and the root the target picked after them; it returns the callable to time (one
    step's proposal over that prefix, leaving no state behind).
    """

    signature: dict
    prepare: Callable[[TargetOutput, torch.Tensor, torch.Tensor], Callable[[], None]]


def heads_proposal(model: MedusaModel, max_rows: int) -> Proposal | None:
    """The heads' proposal: every head's top guesses, as many as a tree of ``max_rows`` rows may take.

    None for a model without heads."""
    if model.heads is None:
        return None
    ranks = min(max(max_rows - 1, 1), model.guess_vocab_size)

    def prepare(prefix: TargetOutput, tokens: torch.Tensor, root: torch.Tensor) -> Callable[[], None]:
        return lambda: model.head_topk_probabilities(
            prefix.hidden[-1], ranks, model.num_heads, next_tokens=root.view(())
        )

    return Proposal({"kind": "medusa-heads"}, prepare)


@dataclass(frozen=True)
class StepCosts:
    """Measured costs in plain decoding steps (see the module docstring), and what they were measured on."""

    row_costs: tuple[float, ...]  # [r - 1]: a verification of r rows
    proposal_cost: float  # the heads' proposal
    plain_step_ms: float  # the unit
    key: dict
    seconds: float  # what the measurement took

    def as_dict(self) -> dict:
        return {"format": COSTS_FORMAT, **asdict(self), "row_costs": list(self.row_costs)}


def model_signature(model: MedusaModel) -> dict:
    """What of the model shapes its step cost: architecture, sizes, and the heads' shape."""
    config = text_config(model.base_model)
    fields = (
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    )
    heads = (
        None
        if model.heads is None
        else {
            "num_heads": model.num_heads,
            "guess_vocab_size": model.guess_vocab_size,
            "num_layers": model.config.num_layers,
        }
    )
    return {**{name: getattr(config, name, None) for name in fields}, "heads": heads}


def cost_key(model: MedusaModel, proposal: Proposal | None = None) -> dict:
    """Everything a step's relative cost depends on: machine, backend, dtype, threads, model, proposer."""
    device = model.device
    return {
        "proposer": None if proposal is None else proposal.signature,
        "cpu": cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device),
        "cpu_capability": cpu_capability(),
        "device": device.type,
        "dtype": dtype_name(model.base_model.dtype),
        "threads": torch.get_num_threads(),
        "kernel": kernel_path().variant or "off",
        "prepack": prepack_layout(model.base_model),
        "torch": torch.__version__,
        "model": model_signature(model),
    }


def cost_cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_root() / COSTS_FOLDER / f"{digest}.json"


def synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def chain_tree(rows: int) -> Tree:
    """A chain of ``rows`` nodes (the root and rows - 1 guesses): the mask shape costs the same as any tree's."""
    return Tree.from_paths([[0] * depth for depth in range(1, rows)])


@torch.inference_mode()
def measure_row_costs(
    model: MedusaModel,
    max_rows: int,
    proposal: Proposal | None = None,
    *,
    rounds: int = CALIBRATION_ROUNDS,
    warmup: int = CALIBRATION_WARMUP_ROUNDS,
) -> StepCosts:
    """Time plain one-token steps, verifications of each of :data:`CALIBRATION_ROWS` up to ``max_rows`` rows,
    and the ``proposal`` (none: cost 0) over a cached random prefix; medians, all sizes interleaved in a fresh
    order each round (``warmup`` untimed rounds, then up to ``rounds`` timed ones, fewer past
    :data:`CALIBRATION_BUDGET_S`)."""
    start = time.perf_counter()
    sync = synchronizer(model.device)
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    vocab = model.base_model.get_output_embeddings().weight.shape[0]
    prefix = torch.randint(0, vocab, (CALIBRATION_PREFIX_TOKENS,), generator=generator).to(model.device)
    sizes = sorted({size for size in CALIBRATION_ROWS if size < max_rows} | {1, max_rows})
    cache = reserved_cache(model, CALIBRATION_PREFIX_TOKENS + max_rows)
    prefill = model.target_forward(prefix[None], cache=cache, use_cache=True, logits_to_keep=1)
    root = prefill.logits[0, -1:].argmax(dim=-1)
    candidates = torch.randint(0, vocab, (max_rows,), generator=generator).to(model.device)
    trees = {size: chain_tree(size) for size in sizes}
    plain_keyword = {cache_keyword(type(model.base_model)): cache}

    def plain() -> None:
        model.base_model(input_ids=root[None], use_cache=True, **plain_keyword).logits[0, -1].argmax()

    def verification(size: int) -> Callable[[], None]:
        def run() -> None:
            tokens = torch.cat([root, candidates[: size - 1]])
            verified = verify_tree(model, cache, trees[size], tokens)
            verified.logits.argmax(dim=-1)
            keep_accepted_in_cache(
                cache, CALIBRATION_PREFIX_TOKENS, torch.zeros(1, dtype=torch.long, device=model.device)
            )

        return run

    work = {"plain": plain, **{size: verification(size) for size in sizes}}
    if proposal is not None:
        work["proposal"] = proposal.prepare(prefill.select(0), prefix, root)
    medians = median_seconds(
        work,
        sync,
        lambda: keep_accepted_in_cache(cache, CALIBRATION_PREFIX_TOKENS, NO_NODES),  # back to the bare prefix
        start,
        rounds=rounds,
        warmup=warmup,
    )
    unit = medians["plain"]
    row_costs = row_costs_from_ratios({size: medians[size] / unit for size in sizes}, max_rows)
    proposal_cost = medians["proposal"] / unit if proposal is not None else 0.0
    return StepCosts(row_costs, proposal_cost, 1000 * unit, cost_key(model, proposal), time.perf_counter() - start)


def median_seconds(
    work: dict, sync: Callable[[], None], reset: Callable[[], None], began: float, *, rounds: int, warmup: int
) -> dict:
    """Each of ``work``'s callables' median time in seconds: ``warmup`` untimed rounds, then up to ``rounds`` timed
    ones (at least :data:`CALIBRATION_MIN_ROUNDS`, no new one past :data:`CALIBRATION_BUDGET_S` after ``began``),
    every round in a fresh order (seeded), ``reset()`` after each call (untimed), ``sync()`` around each."""
    samples: dict = {name: [] for name in work}
    shuffler = random.Random(CALIBRATION_SEED)
    for round_ in range(warmup + rounds):
        if round_ >= warmup + CALIBRATION_MIN_ROUNDS and time.perf_counter() - began > CALIBRATION_BUDGET_S:
            break
        for name in shuffler.sample(list(work), len(work)):
            sync()
            start = time.perf_counter()
            work[name]()
            sync()
            if round_ >= warmup:
                samples[name].append(time.perf_counter() - start)
            reset()
    return {name: statistics.median(times) for name, times in samples.items()}


def cache_entry(path: Path, costs) -> str:
    """Write measured ``costs`` (anything with ``as_dict()``) to the cache entry ``path`` (or the writable place
    :func:`~medusa_lite.paths.writable_entry` gives); where they went, as the announcement says it."""
    try:
        path = writable_entry(path)
        write_cached_costs(path, costs)
        return f"cached in {path}"
    except OSError as error:
        return f"not cached: {error}"


def cached_or_measured(entry: Path, read: Callable[[Path], Cached | None], measure: Callable[[], Cached]):
    """(what ``read`` finds at the cache entry ``entry``, None), else (``measure()``, where it was cached, as
    :func:`cache_entry` says it). Threads missing one entry together take turns on
    :func:`~medusa_lite.paths.entry_lock`: the first measures, the rest read what it cached."""
    cached = read(existing_entry(entry))
    if cached is not None:
        return cached, None
    with entry_lock(entry):
        path = existing_entry(entry)
        cached = read(path)  # measured by another thread while this one waited
        if cached is not None:
            return cached, None
        measured = measure()
        return measured, cache_entry(path, measured)


def row_costs_from_ratios(ratios: dict[int, float], max_rows: int) -> tuple[float, ...]:
    """``row_costs`` for 1..``max_rows`` rows from the measured sizes' time over a plain step's (``ratios``).

    A one-row verification takes the plain step's own path, so below 1 it is timing noise. From two rows on a
    verification may take a faster path than the plain step (the packed few-row kernel, where the target's one-row
    products stay PyTorch's and that path is slow, as on some AMD EPYCs): a ratio below 1 is then real, and
    clamping it to 1 would price every row up to the largest as free. Those sizes are made non-decreasing instead
    (more rows never cost less than fewer on one path); a size not measured takes the next larger measured one's
    cost (never an underestimate).
    """
    sizes = sorted(ratios)
    measured, floor = {}, 0.0
    for size in sizes:
        if size == 1:
            measured[size] = max(1.0, ratios[size])
        else:
            floor = measured[size] = max(ratios[size], floor)
    return tuple(next(measured[size] for size in sizes if size >= rows) for rows in range(1, max_rows + 1))


def all_positive_and_finite(numbers: Iterable[float]) -> bool:
    """Whether every cost read back from a cache is one a step could have cost (a hand edit or a broken
    writer can leave NaN, infinities, zeros or negative numbers: those entries are measured again)."""
    return all(math.isfinite(n) and n > 0 for n in numbers)


def read_cached_costs(path: Path, key: dict, max_rows: int) -> StepCosts | None:
    """The costs cached at ``path`` when they were measured for ``key`` and cover ``max_rows`` rows, else None."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        costs = StepCosts(
            tuple(float(c) for c in values["row_costs"]),
            float(values["proposal_cost"]),
            float(values["plain_step_ms"]),
            values["key"],
            float(values["seconds"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: measure again
    usable = all_positive_and_finite((*costs.row_costs, costs.plain_step_ms)) and (
        math.isfinite(costs.proposal_cost) and costs.proposal_cost >= 0  # a proposal may be free
    )
    return (
        costs
        if values.get("format") == COSTS_FORMAT and costs.key == key and len(costs.row_costs) >= max_rows and usable
        else None
    )


def write_cached_costs(path: Path, costs: StepCosts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{time.time_ns()}.tmp")
    scratch.write_text(json.dumps(costs.as_dict(), indent=1) + "\n", encoding="utf-8")
    scratch.replace(path)


def step_costs(
    model: MedusaModel,
    max_rows: int,
    proposal: Proposal | None = None,
    *,
    announce: Callable[[str], None] | None = None,
) -> StepCosts:
    """This machine's step costs for ``model`` up to ``max_rows`` rows and the ``proposal`` (default: the heads',
    :func:`heads_proposal`): cached, else measured now and cached.

    ``announce`` gets a one-line message when a measurement runs (default: printed to stderr).
    """
    proposal = proposal if proposal is not None else heads_proposal(model, max_rows)
    key = cost_key(model, proposal)
    costs, where = cached_or_measured(
        cost_cache_path(key),
        lambda path: read_cached_costs(path, key, max_rows),
        lambda: measure_row_costs(model, max_rows, proposal),
    )
    if where is None:
        return costs
    (announce or print_to_stderr)(
        f"medusa-lite: measured this machine's step costs for the dynamic tree in {costs.seconds:.1f} s "
        f"({max_rows} rows cost {costs.row_costs[-1]:.2f} plain steps; {where})"
    )
    return costs


def print_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
