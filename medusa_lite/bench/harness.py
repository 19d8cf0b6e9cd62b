"""The Spec-Bench harness: each method (plain ``model.generate``, its packed path, prompt lookup, medusa-lite
with each source of guesses) run on the same model, interleaved per question in a rotated order, one record
per question. ``medusa-lite benchmark`` (:mod:`medusa_lite.commands.benchmark`) is its command line."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from medusa_lite.artifacts.loading import (
    drafter_proposer_for,
    prepack_for_tree,
    read_artifact,
    tree_of,
)
from medusa_lite.artifacts.resolve import resolve_source
from medusa_lite.bench.measure import chat_input_ids, plain_generate, timed
from medusa_lite.cpu.prepack import packed_from_rows, prepack_backend
from medusa_lite.decoding.generate import DEFAULT_DATASTORE_TOKENS, DEFAULT_LOOKUP_TOKENS, generate
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings
from medusa_lite.drafters.registry import kind_of
from medusa_lite.drafters.sequential.proposer import DEFAULT_DRAFTER_NODES
from medusa_lite.errors import MedusaError
from medusa_lite.proposers.base import Proposer, step_rows
from medusa_lite.proposers.draft_model import DraftModelProposer
from medusa_lite.proposers.lookahead import LookaheadProposer
from medusa_lite.proposers.lookup import default_lookups
from medusa_lite.trees.dynamic_tree import UNMEASURED_ROW_COSTS, DynamicTree
from medusa_lite.trees.tree import Tree

PLD_NUM_TOKENS = 10
WARMUP_TOKENS = 16
PROGRESS_FILE = "progress.jsonl"  # one line per finished question, written as the run goes
METHODS = (
    "plain",
    "plain_kernel",
    "pld",
    "medusa",
    "static_tree",
    "no_datastore",
    "heads",
    "drafter",
    "draft",
    "lookahead",
)
LABELS = {
    "plain": "plain generate",
    "plain_kernel": "plain generate, packed path",
    "pld": "prompt lookup (PLD)",
    "medusa": "medusa-lite",
    "static_tree": "medusa-lite, static tree",
    "no_datastore": "medusa-lite, no datastore",
    "heads": "medusa-lite, heads only",
    "drafter": "medusa-lite, drafter (sequential or Hydra-style) + lookups",
    "draft": "medusa-lite, draft model",
    "lookahead": "lookahead decoding (LookaheadProposer, defaults)",
}
DEFAULT_METHODS = (
    "plain",
    "pld",
    "medusa",
    "no_datastore",
    "heads",
)  # "static_tree" on request; "plain_kernel" added where it applies
SHORT = {
    "plain_kernel": "plain kernel",
    "pld": "PLD",
    "medusa": "medusa",
    "static_tree": "static tree",
    "no_datastore": "no datastore",
    "heads": "heads only",
    "drafter": "drafter",
    "draft": "draft model",
    "lookahead": "lookahead",
}
GREEDY = SamplingSettings()


def rotated(methods: Sequence[str], index: int) -> list[str]:
    shift = index % len(methods)
    return list(methods[shift:]) + list(methods[:shift])


@dataclass
class Result:
    tokens: list[int]
    seconds: float
    target_calls: int
    steps: int = 0  # medusa only: verification steps
    accepted_at_depth: list[int] = field(default_factory=list)  # medusa only
    lookup_steps: int = 0  # medusa only: steps that accepted a lookup-only guess
    datastore_steps: int = 0  # medusa only: of those, steps whose lookup chain came from the datastore
    verified_rows: int = 0  # medusa only: tree + lookup rows verified, summed over steps


@dataclass(frozen=True)
class MedusaSettings:
    tree: Tree | DynamicTree
    lookup_tokens: int
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS
    static_tree: Tree | None = None  # for "static_tree": the tree file's static paths
    draft: DraftModelProposer | None = None  # for "draft": the draft model (--draft-model)
    drafter: tuple[Proposer, ...] | None = None  # for "drafter": the lookups and the drafter (--drafter)


class CallCounter:
    """Counts forwards of a module while active (a forward pre-hook)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.calls, self.handle = module, 0, None

    def __enter__(self) -> CallCounter:
        self.handle = self.module.register_forward_pre_hook(self._count)
        return self

    def _count(self, module, args) -> None:
        self.calls += 1

    def __exit__(self, *exc) -> None:
        self.handle.remove()


def run_hf(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, **extra) -> Result:
    with CallCounter(model.base_model) as counter:
        tokens, seconds = timed(lambda: plain_generate(model.base_model, input_ids, max_new_tokens, GREEDY, **extra))
    return Result(tokens.tolist(), seconds, counter.calls)


def run_plain(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_hf(model, input_ids, max_new_tokens)


def run_plain_kernel(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    with packed_from_rows(model.base_model, 1):
        return run_hf(model, input_ids, max_new_tokens)


def run_pld(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_hf(model, input_ids, max_new_tokens, prompt_lookup_num_tokens=PLD_NUM_TOKENS)


def run_medusa_with(
    model: MedusaModel,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    tree: Tree | DynamicTree,
    lookup_tokens: int,
    datastore_tokens: int,
) -> Result:
    return timed_generate(
        model, input_ids, max_new_tokens, tree=tree, lookup_tokens=lookup_tokens, datastore_tokens=datastore_tokens
    )


def timed_generate(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, **options) -> Result:
    """One timed :func:`generate` call with ``options`` and what its statistics say, as a :class:`Result`."""
    output, seconds = timed(lambda: generate(model, input_ids, max_new_tokens, **options))
    stats = output.stats
    return Result(
        output.sequences[0, input_ids.shape[1] :].tolist(),
        seconds,
        stats.target_calls,
        stats.steps,
        list(stats.accepted_at_depth),
        stats.lookup_steps,
        stats.datastore_steps,
        stats.verified_rows,
    )


def run_medusa(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_medusa_with(
        model, input_ids, max_new_tokens, settings.tree, settings.lookup_tokens, settings.datastore_tokens
    )


def run_static_tree(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    return run_medusa_with(
        model, input_ids, max_new_tokens, settings.static_tree, settings.lookup_tokens, settings.datastore_tokens
    )


def run_no_datastore(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    return run_medusa_with(model, input_ids, max_new_tokens, settings.tree, settings.lookup_tokens, datastore_tokens=0)


def run_heads(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return run_medusa_with(model, input_ids, max_new_tokens, settings.tree, lookup_tokens=0, datastore_tokens=0)


def run_drafter(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return timed_generate(model, input_ids, max_new_tokens, proposers=settings.drafter)


def run_draft(model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings) -> Result:
    return timed_generate(model, input_ids, max_new_tokens, proposers=[settings.draft])


def run_lookahead(
    model: MedusaModel, input_ids: torch.Tensor, max_new_tokens: int, settings: MedusaSettings
) -> Result:
    """Lookahead decoding alone (:class:`medusa_lite.LookaheadProposer` with its defaults), no heads, no lookups."""
    return timed_generate(model, input_ids, max_new_tokens, proposers=[LookaheadProposer()])


RUNNERS: dict[str, Callable[..., Result]] = {
    "plain": run_plain,
    "plain_kernel": run_plain_kernel,
    "pld": run_pld,
    "medusa": run_medusa,
    "static_tree": run_static_tree,
    "no_datastore": run_no_datastore,
    "heads": run_heads,
    "drafter": run_drafter,
    "draft": run_draft,
    "lookahead": run_lookahead,
}


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length), None when identical."""
    for index, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def question_record(question: dict, order: Sequence[str], results: dict[str, Result]) -> dict:
    reference = results["plain"].tokens
    methods = {}
    for method, result in results.items():
        difference = first_difference(result.tokens, reference)
        methods[method] = {
            "new_tokens": len(result.tokens),
            "seconds": result.seconds,
            "target_calls": result.target_calls,
            "identical_to_plain": difference is None,
            "first_difference": difference,
            "steps": result.steps,
            "accepted_at_depth": result.accepted_at_depth,
            "lookup_steps": result.lookup_steps,
            "datastore_steps": result.datastore_steps,
            "verified_rows": result.verified_rows,
        }
    return {
        "question_id": question["question_id"],
        "category": question["category"],
        "order": list(order),
        "methods": methods,
    }


def run_benchmark(
    model: MedusaModel,
    tokenizer,
    questions: Sequence[dict],
    max_new_tokens: int,
    methods: Sequence[str] = DEFAULT_METHODS,
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS,
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS,
    on_record: Callable[[dict], None] | None = None,
    static_tree: Tree | None = None,
    draft: DraftModelProposer | None = None,
    drafter: Sequence[Proposer] | None = None,
) -> list[dict]:
    """One record per question (see :func:`question_record`); ``on_record`` gets each as soon as it is measured.

    ``static_tree``: the tree of the ``static_tree`` method (required for it).
    """
    kernel_runs = prepack_backend(model.base_model) is not None
    methods = [
        method
        for method in METHODS
        if method in set(methods) | {"plain"} | ({"plain_kernel"} if kernel_runs else set())
    ]
    if "plain_kernel" in methods and not kernel_runs:
        raise MedusaError(
            "the 'plain_kernel' method needs the model's weights packed (float32 on CPU, without --no-prepack)"
        )
    if "static_tree" in methods and static_tree is None:
        raise MedusaError(
            "the 'static_tree' method needs a tree file with static paths (--tree, or tree.json beside the heads)"
        )
    if "draft" in methods and draft is None:
        raise MedusaError(
            "the 'draft' method needs a draft model: --draft-model PATH (an HF causal LM with the target's tokenizer)"
        )
    if "drafter" in methods and drafter is None:
        raise MedusaError("the 'drafter' method needs a sequential drafter: --drafter PATH (a folder or Hub repo)")
    settings = MedusaSettings(
        tree_of(model), lookup_tokens, datastore_tokens, static_tree, draft, tuple(drafter) if drafter else None
    )
    prompts = [chat_input_ids(tokenizer, question["turns"][0]).to(model.device) for question in questions]
    for method in methods:  # warm-up
        RUNNERS[method](model, prompts[0], WARMUP_TOKENS, settings)
    records = []
    for index, (question, input_ids) in enumerate(tqdm(list(zip(questions, prompts)), desc="Spec-Bench")):
        order = rotated(methods, index)
        results = {method: RUNNERS[method](model, input_ids, max_new_tokens, settings) for method in order}
        records.append(question_record(question, order, results))
        if on_record is not None:
            on_record(records[-1])
    return records


def progress_writer(path: Path) -> Callable[[dict], None]:
    """Append each finished question's record to ``path`` (JSON lines), so a crash loses no measured question."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("", encoding="utf-8")

    def write(record: dict) -> None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    return write


def drafter_proposers(
    model: MedusaModel, drafter_path: str, lookup_tokens: int, datastore_tokens: int, prepack: bool | None
) -> tuple[Proposer, ...]:
    """The 'drafter' method's proposers on the benchmark's target: the default lookups (the model's datastore),
    then the drafter at ``drafter_path`` (a sequential drafter or Hydra-style heads), priced on this machine; the
    target re-packed for the wider of its two drafts (``prepack``: as ``load``'s)."""
    drafter = read_artifact(resolve_source(drafter_path, "drafter"))
    drafting = kind_of(drafter).drafting
    if drafting is None:
        raise MedusaError(
            f"--drafter {drafter_path} holds Medusa heads: pass a sequential drafter or Hydra-style heads "
            "(the 'medusa' method decodes with heads, --heads)"
        )
    budget = DynamicTree(1 + DEFAULT_DRAFTER_NODES, UNMEASURED_ROW_COSTS)
    lookups = default_lookups(lookup_tokens, True, datastore_tokens)
    spec = drafting.proposer(drafter, max_new_nodes=DEFAULT_DRAFTER_NODES)
    rows = step_rows((lookups, spec), model)
    prepack_for_tree(model.base_model, Tree(()), prepack, max(rows, step_rows(model.proposers, model)))
    return lookups, drafter_proposer_for(model, drafter, budget)
