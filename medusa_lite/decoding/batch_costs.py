"""What the steps of a batch cost on the machine that decodes it, measured once per batch size and cached.

A batch of B sequences (:mod:`medusa_lite.decoding.batch`) verifies every sequence's draft in one [B, Q] forward,
so what speculation buys depends on what that forward costs against a plain batched step (one new token for
every sequence): less and less as B rows fill the machine, and in steps where the linear layers change path
(the packed few-row kernel, PyTorch's own) that no estimate from one sequence's costs sees. So a batch's policy is
priced by costs timed for its batch size, as one sequence's are (:mod:`medusa_lite.trees.costs`): the first batch
of a size on a new machine, dtype, thread count, packing or model measures them (a few seconds, with a one-line
message on stderr) and caches them beside one sequence's, keyed by the same :func:`~medusa_lite.trees.costs.cost_key`
plus the batch size.

Timed over a cached random prefix per sequence, sizes interleaved in a fresh order each round as one sequence's are:
a plain batched step as ``model.generate`` takes it (the target's own forward of [B, 1] tokens), a plain
one-sequence step (the unit of a policy's ``proposal_cost``), and verifications of r rows a sequence through the
batch loop's own :func:`~medusa_lite.decoding.batch.verify_batch` and cache compaction. Row counts past
:data:`MAX_CALIBRATION_BATCH_ROWS` rows a forward are not timed (a policy prices them in proportion to rows,
:meth:`~medusa_lite.trees.dynamic_tree.DynamicTree.cost`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from medusa_lite.decoding.batch import row_step, verify_batch
from medusa_lite.decoding.cache import keep_accepted_per_sequence, reserved_cache
from medusa_lite.decoding.model import MedusaModel, cache_keyword
from medusa_lite.decoding.verify import keep_accepted_in_cache
from medusa_lite.trees.costs import (
    CALIBRATION_PREFIX_TOKENS,
    CALIBRATION_ROUNDS,
    CALIBRATION_ROWS,
    CALIBRATION_SEED,
    CALIBRATION_WARMUP_ROUNDS,
    NO_NODES,
    all_positive_and_finite,
    cached_or_measured,
    cost_cache_path,
    cost_key,
    median_seconds,
    print_to_stderr,
    row_costs_from_ratios,
    synchronizer,
)
from medusa_lite.trees.draft import HEADS_SOURCE, chain_draft
from medusa_lite.trees.dynamic_tree import BatchCosts

BATCH_COSTS_FORMAT = "medusa-lite-batch-costs/1"
# Verifications of more rows than this in one forward are not timed: a few seconds of calibration cover the row
# counts a batch's policy chooses among (it shrinks each sequence's tree as the batch grows).
MAX_CALIBRATION_BATCH_ROWS = 256


@dataclass(frozen=True)
class MeasuredBatchCosts:
    """:class:`BatchCosts` with what they were measured on and what measuring took."""

    costs: BatchCosts
    plain_step_ms: float  # a plain batched step
    key: dict
    seconds: float

    def as_dict(self) -> dict:
        return {
            "format": BATCH_COSTS_FORMAT,
            "batch_size": self.costs.batch_size,
            "row_costs": list(self.costs.row_costs),
            "plain_step_ratio": self.costs.plain_step_ratio,
            "plain_step_ms": self.plain_step_ms,
            "key": self.key,
            "seconds": self.seconds,
        }


def batch_cost_key(model: MedusaModel, batch_size: int) -> dict:
    return {**cost_key(model), "batch_size": batch_size}


def timed_row_counts(batch_size: int, max_rows: int) -> list[int]:
    """The rows a sequence timed: :data:`~medusa_lite.trees.costs.CALIBRATION_ROWS` up to ``max_rows``, and
    ``max_rows``, while a forward stays within :data:`MAX_CALIBRATION_BATCH_ROWS` rows (1 and 2 always)."""
    wanted = {size for size in CALIBRATION_ROWS if size < max_rows} | {1, min(2, max_rows), max_rows}
    return sorted(size for size in wanted if size <= 2 or size * batch_size <= MAX_CALIBRATION_BATCH_ROWS)


@torch.inference_mode()
def measure_batch_costs(
    model: MedusaModel,
    batch_size: int,
    max_rows: int,
    *,
    rounds: int = CALIBRATION_ROUNDS,
    warmup: int = CALIBRATION_WARMUP_ROUNDS,
) -> MeasuredBatchCosts:
    """Time plain batched and one-sequence steps and verifications of :func:`timed_row_counts` rows a sequence over
    ``batch_size`` cached random prefixes (medians; see the module docstring)."""
    began = time.perf_counter()
    sync = synchronizer(model.device)
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    vocab = model.base_model.get_output_embeddings().weight.shape[0]
    device, length = model.device, CALIBRATION_PREFIX_TOKENS
    prefix = torch.randint(0, vocab, (batch_size, length), generator=generator).to(device)
    sizes = timed_row_counts(batch_size, max_rows)
    caches = [reserved_cache(model, length + max(sizes)) for _ in range(2)]  # the batch's, one sequence's
    batch_cache, single_cache = caches
    prefill = model.target_forward(prefix, cache=batch_cache, use_cache=True, logits_to_keep=1)
    model.target_forward(prefix[:1], cache=single_cache, use_cache=True, logits_to_keep=1)
    roots = prefill.logits[:, -1].argmax(dim=-1)
    candidates = torch.randint(0, vocab, (batch_size, max(sizes)), generator=generator).to(device)
    committed = torch.full((batch_size,), length, dtype=torch.long, device=device)
    padding = torch.zeros(batch_size, dtype=torch.long, device=device)
    keyword = cache_keyword(type(model.base_model))
    plain_mask = torch.ones(batch_size, length + 1, dtype=torch.long, device=device)
    roots_only = [torch.zeros(1, dtype=torch.long)] * batch_size

    def plain(cache, sequences: int) -> Callable[[], None]:
        def run() -> None:
            output = model.base_model(
                input_ids=roots[:sequences, None],
                attention_mask=plain_mask[:sequences],
                use_cache=True,
                **{keyword: cache},
            )
            output.logits[:, -1].argmax(dim=-1)

        return run

    def verification(size: int) -> Callable[[], None]:
        steps = [
            row_step(chain_draft(roots[b], candidates[b, : size - 1], HEADS_SOURCE), []) for b in range(batch_size)
        ]

        def run() -> None:
            verify_batch(model, batch_cache, steps, committed, padding).logits.argmax(dim=-1)
            keep_accepted_per_sequence(batch_cache, length, committed, roots_only)

        return run

    def reset_caches() -> None:
        for each in caches:
            keep_accepted_in_cache(each, length, NO_NODES)  # back to the bare prefixes

    work = {"plain": plain(batch_cache, batch_size), "single": plain(single_cache, 1)}
    work.update({size: verification(size) for size in sizes})
    medians = median_seconds(work, sync, reset_caches, began, rounds=rounds, warmup=warmup)
    unit = medians["plain"]
    ratios = {size: medians[size] / unit for size in sizes}
    costs = BatchCosts(batch_size, row_costs_from_ratios(ratios, max(sizes)), unit / medians["single"])
    return MeasuredBatchCosts(costs, 1000 * unit, batch_cost_key(model, batch_size), time.perf_counter() - began)


def read_cached_batch_costs(path: Path, key: dict, max_rows: int) -> BatchCosts | None:
    """The costs cached at ``path`` when measured for ``key`` up to ``max_rows`` rows (or every row the calibration
    times for that batch size), else None."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        costs = BatchCosts(
            int(values["batch_size"]),
            tuple(float(c) for c in values["row_costs"]),
            float(values["plain_step_ratio"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: measure again
    covered = len(costs.row_costs) >= max(timed_row_counts(costs.batch_size, max_rows))
    usable = covered and all_positive_and_finite((*costs.row_costs, costs.plain_step_ratio))
    return costs if values.get("format") == BATCH_COSTS_FORMAT and values.get("key") == key and usable else None


def batch_step_costs(
    model: MedusaModel, batch_size: int, max_rows: int, *, announce: Callable[[str], None] | None = None
) -> BatchCosts:
    """This machine's costs of a step of ``batch_size`` sequences of ``model``, up to ``max_rows`` rows a sequence:
    cached, else measured now and cached (``announce`` gets a one-line message then; default: stderr)."""
    key = batch_cost_key(model, batch_size)
    found, where = cached_or_measured(
        cost_cache_path(key),
        lambda path: read_cached_batch_costs(path, key, max_rows),
        lambda: measure_batch_costs(model, batch_size, max_rows),
    )
    if where is None:
        return found  # BatchCosts read from the cache
    measured = found
    (announce or print_to_stderr)(
        f"medusa-lite: measured this machine's step costs for batches of {batch_size} in {measured.seconds:.1f} s "
        f"({len(measured.costs.row_costs)} rows a sequence cost {measured.costs.row_costs[-1]:.2f} plain batched "
        f"steps; {where})"
    )
    return measured.costs


def batch_costs_for(model: MedusaModel, batch_size: int) -> Callable[[int], BatchCosts]:
    """``max_rows -> batch_step_costs(model, batch_size, max_rows)``, measured at most once per generation."""
    return cache(lambda max_rows: batch_step_costs(model, batch_size, max_rows))
