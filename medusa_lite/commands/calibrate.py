"""``medusa-lite calibrate``: size the candidate tree to your hardware and heads, and write ``tree.json`` beside the
heads.

    medusa-lite calibrate                         # default model + shipped heads, fp32 on CPU
    medusa-lite calibrate --dtype fp32 --threads 2
    medusa-lite calibrate --model M --heads H --measure-on my_prompts.jsonl
    medusa-lite calibrate --costs-only            # step (a) only; no trained heads needed

(a) Cost: over a cached prefix of ``--prefix-tokens`` tokens, time one decoding step with a tree
    of N nodes for each N in ``--sizes``: propose (heads) + verify (one target forward of N
    tokens, ``verify_tree``) + accept + cache compaction; median of ``--repeats`` runs after
    ``--warmup`` runs, sizes interleaved (a fresh random order every round) so background load
    and drift hit all sizes alike. The pure verify
    time is reported too. N = 1 is plain decoding by the same loop, the unit of cost.
(b) Accuracy: per-head, per-rank top-k accuracies from the heads' ``training_summary
    ["topk_accuracy"]``, or measured with ``--measure-on PROMPTS`` (greedy continuations of your
    prompts, checking each head's ranked guesses against the tokens the target actually chose).
    Use your own prompts, never the benchmark's questions.
(c) Choice: for each N, ``best_tree(accuracy, N)`` (Medusa's greedy construction) and its
    predicted speed-up = expected accepted tokens per step / (step cost(N) / step cost(1)); the N
    with the highest prediction wins. The table and the chosen tree go to ``tree.json`` (default:
    in the heads folder, where ``medusa_lite.load`` picks it up; ``--out`` elsewhere), with the
    dynamic policy (:class:`~medusa_lite.trees.dynamic_tree.DynamicTree`: up to
    ``--dynamic-max-nodes`` nodes per step, chosen from the heads' confidence), which ``load``
    then decodes with; ``--dynamic-max-nodes 0`` writes the static tree only. The file keeps the
    policy's portable settings only: ``load`` prices it with the step costs of the machine that
    decodes (:mod:`medusa_lite.trees.costs`); the table here is a note of this machine's.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import Cache

from medusa_lite.artifacts.loading import (
    DEFAULT_HEADS_DIR,
    TREE_FILE_NAME,
    MissingHeadsError,
    heads_source_for,
    load,
    load_target,
    verification_rows,
    write_tree_file,
)
from medusa_lite.bench.measure import chat_input_ids, machine_info, plain_generate
from medusa_lite.commands.options import set_threads
from medusa_lite.cpu.prepack import default_backend, prepack_linears, prepack_supported
from medusa_lite.decoding.cache import reserved_cache
from medusa_lite.decoding.generate import accepted_path
from medusa_lite.decoding.model import MedusaModel
from medusa_lite.decoding.sampling import SamplingSettings, pick_tokens
from medusa_lite.decoding.verify import keep_accepted_in_cache, verify_tree
from medusa_lite.drafters.medusa.proposer import heads_draft
from medusa_lite.dtypes import DTYPE_CHOICES, dtype_name, parse_dtype
from medusa_lite.errors import MedusaError
from medusa_lite.trees.dynamic_tree import (
    DEFAULT_MAX_NODES,
    DEFAULT_TOKENS_PER_COST,
    DynamicTree,
    row_costs_from_table,
)
from medusa_lite.trees.tree import REFERENCE_TOPK_ACCURACY, Tree, best_tree, expected_accepted_tokens

DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_PREFIX_TOKENS = 200
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3
DEFAULT_MAX_RANK = 10
DEFAULT_MEASURE_TOKENS = 128
COSTS_ONLY_NUM_HEADS = 4  # fresh heads of this count stand in for trained ones (same cost)
PREFIX_SEED = 0
GREEDY = SamplingSettings()
NO_NODES = torch.zeros(0, dtype=torch.long)


# -- (a) cost of one step by tree size ---------------------------------------------------------
@dataclass
class StepCost:
    num_nodes: int
    verify_ms: float  # one target forward over the tree (median)
    step_ms: float  # propose + verify + accept + compaction (median)


def random_prefix(vocab_size: int, length: int, seed: int = PREFIX_SEED) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=generator)


def timed_step(
    model: MedusaModel, cache: Cache, hidden: torch.Tensor, root: torch.Tensor, tree: Tree
) -> tuple[float, float]:
    """(verify seconds, whole-step seconds) of one decoding step; the cache is put back as it was."""
    prefix_len = cache.get_seq_length()
    start = time.perf_counter()
    draft = heads_draft(model, hidden, root, tree)
    verify_start = time.perf_counter()
    verified = verify_tree(model, cache, draft, draft.tokens)
    verify_end = time.perf_counter()
    target_tokens = pick_tokens(verified.logits, GREEDY)
    keep_accepted_in_cache(cache, prefix_len, accepted_path(draft, draft.tokens, target_tokens))
    end = time.perf_counter()
    keep_accepted_in_cache(cache, prefix_len, NO_NODES)  # back to the bare prefix
    return verify_end - verify_start, end - start


@torch.inference_mode()
def measure_step_costs(
    model: MedusaModel,
    trees: Sequence[Tree],
    *,
    prefix_tokens: int,
    repeats: int,
    warmup: int,
    prepack: bool = False,
    seed: int = PREFIX_SEED,
) -> list[StepCost]:
    """Median verify and step time of each tree over a cached random prefix.

    Unpacked, or packed (as ``load`` packs it, once for the largest tree + default lookup chain):
    ``warmup`` untimed rounds, then ``repeats`` rounds timing every tree once, in a fresh random
    order each round, so slow drift of the machine hits all sizes alike.
    """
    prefix = random_prefix(model.config.vocab_size, prefix_tokens).to(model.device)
    cache = reserved_cache(model, prefix_tokens + max(tree.num_nodes for tree in trees))  # as generate reserves it
    prefill = model.target_forward(prefix[None], cache=cache, use_cache=True)
    root = prefill.logits[0, -1:].argmax(dim=-1)
    hidden = prefill.hidden[0, -1]
    samples: list[list[tuple[float, float]]] = [[] for _ in trees]
    if prepack:
        prepack_linears(model.base_model, verification_rows(max(tree.num_nodes for tree in trees)))
    schedule = shuffled_schedule(len(trees), repeats, warmup, random.Random(seed))
    for index, timed in tqdm(schedule, desc="timing steps", leave=False):
        timing = timed_step(model, cache, hidden, root, trees[index])
        if timed:
            samples[index].append(timing)
    return [
        StepCost(
            tree.num_nodes, 1000 * statistics.median(v for v, _ in runs), 1000 * statistics.median(s for _, s in runs)
        )
        for tree, runs in zip(trees, samples)
    ]


def shuffled_schedule(num_trees: int, repeats: int, warmup: int, shuffler: random.Random) -> list[tuple[int, bool]]:
    """(tree index, timed) steps: rounds of every tree once in a fresh order, the first ``warmup`` untimed."""
    return [
        (index, round_ >= warmup)
        for round_ in range(warmup + repeats)
        for index in shuffler.sample(range(num_trees), num_trees)
    ]


# -- (b) per-head top-k accuracy ---------------------------------------------------------------
def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a .jsonl file ("prompt", or the first of "turns") or a text file (one per line)."""
    path = Path(path)
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return lines
    prompts = []
    for line in lines:
        record = json.loads(line)
        prompts.append(record["prompt"] if "prompt" in record else record["turns"][0])
    return prompts


@torch.inference_mode()
def head_hits(
    model: MedusaModel, sequence: torch.Tensor, first_position: int, max_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head and rank, how often its guess was right, and per head how many guesses were checked.

    The hidden state at position n (whose logits chose token n+1) is what decoding gives the
    heads; head i (0-based) guesses token n+2+i.
    """
    hidden = model.target_forward(sequence[None]).hidden[0]
    hits = torch.zeros(model.num_heads, max_rank)
    counts = torch.zeros(model.num_heads)
    for position in range(first_position, sequence.numel() - 2):  # head 1 needs token n+2
        next_token = sequence[position + 1] if model.reads_next_token else None
        guesses = model.head_topk(hidden[position], max_rank, next_tokens=next_token).cpu()  # [K, max_rank]
        for head in range(model.num_heads):
            target_position = position + 2 + head
            if target_position < sequence.numel():
                hits[head] += (guesses[head] == sequence[target_position].cpu()).float()
                counts[head] += 1
    return hits, counts


def measure_topk_accuracy(
    model: MedusaModel, prompts_ids: Sequence[torch.Tensor], *, max_new_tokens: int, max_rank: int
) -> list[list[float]]:
    """accuracy[head][rank] on greedy continuations of the prompts (the target's own tokens)."""
    hits = torch.zeros(model.num_heads, max_rank)
    counts = torch.zeros(model.num_heads)
    for input_ids in tqdm(prompts_ids, desc="measuring head accuracy", leave=False):
        with torch.inference_mode():
            new_tokens = plain_generate(model.base_model, input_ids.to(model.device), max_new_tokens, GREEDY)
        sequence = torch.cat([input_ids[0].to(model.device), new_tokens])
        prompt_hits, prompt_counts = head_hits(model, sequence, input_ids.shape[1] - 1, max_rank)
        hits += prompt_hits
        counts += prompt_counts
    return (hits / counts.clamp(min=1)[:, None]).tolist()


# -- (c) choose the tree ------------------------------------------------------------------------
@dataclass
class Row:
    num_nodes: int
    verify_ms: float
    step_ms: float
    relative_cost: float
    expected_accepted_tokens: float
    predicted_speedup: float


def trees_for_sizes(topk_accuracy: Sequence[Sequence[float]], sizes: Sequence[int]) -> list[Tree]:
    return [best_tree(topk_accuracy, size) for size in sizes]


def prediction_table(
    trees: Sequence[Tree], costs: Sequence[StepCost], topk_accuracy: Sequence[Sequence[float]]
) -> list[Row]:
    """One row per tree; cost relative to the 1-node tree (plain decoding by the same loop)."""
    unit = next(cost.step_ms for cost in costs if cost.num_nodes == 1)
    rows = []
    for tree, cost in zip(trees, costs):
        expected = expected_accepted_tokens(tree, topk_accuracy)
        relative = cost.step_ms / unit
        rows.append(Row(tree.num_nodes, cost.verify_ms, cost.step_ms, relative, expected, expected / relative))
    return rows


def best_row(rows: Sequence[Row]) -> Row:
    return max(rows, key=lambda row: row.predicted_speedup)


def dynamic_policy(rows: Sequence[Row], max_nodes: int, tokens_per_cost: float) -> DynamicTree | None:
    """The per-step policy sized by the measured step costs, up to ``max_nodes`` nodes plus the default lookup
    chain.
    """
    if max_nodes <= 0:
        return None
    table = [{"num_nodes": row.num_nodes, "relative_cost": row.relative_cost} for row in rows]
    return DynamicTree(max_nodes, row_costs_from_table(table, verification_rows(max_nodes)), tokens_per_cost)


def format_table(rows: Sequence[Row], chosen: Row | None) -> str:
    lines = ["nodes  verify ms  step ms  rel. cost  E[tokens/step]  pred. speed-up", "-" * 67]
    for row in rows:
        mark = "  <- chosen" if chosen is not None and row.num_nodes == chosen.num_nodes else ""
        lines.append(
            f"{row.num_nodes:5d}  {row.verify_ms:9.2f}  {row.step_ms:7.2f}  {row.relative_cost:9.3f}  "
            f"{row.expected_accepted_tokens:14.3f}  {row.predicted_speedup:14.3f}{mark}"
        )
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="medusa-lite calibrate", description="Choose the candidate tree size for this machine and these heads."
    )
    parser.add_argument("--model", default=None, help="HF model folder or Hub id (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--heads", default=None, help=f"heads folder or Hub repo (default: {DEFAULT_HEADS_DIR})")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto", help="auto: fp32 on CPU, bf16 on GPU")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(s) for s in text.split(",")],
        default=list(DEFAULT_SIZES),
        help="tree sizes (nodes) to time, comma-separated; 1 is always added",
    )
    parser.add_argument("--prefix-tokens", type=int, default=DEFAULT_PREFIX_TOKENS)
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    parser.add_argument(
        "--measure-on",
        default=None,
        help="prompts (.jsonl or .txt) to measure head accuracies on, instead of the heads' training summary",
    )
    parser.add_argument(
        "--measure-tokens", type=int, default=DEFAULT_MEASURE_TOKENS, help="greedy tokens per prompt for --measure-on"
    )
    parser.add_argument(
        "--max-rank", type=int, default=DEFAULT_MAX_RANK, help="ranks per head measured by --measure-on"
    )
    parser.add_argument(
        "--no-prepack",
        action="store_true",
        help="time steps without pre-packed linear weights (as load(prepack=False) decodes)",
    )
    parser.add_argument(
        "--costs-only", action="store_true", help="only time steps (fresh heads stand in if none are given)"
    )
    parser.add_argument(
        "--static-paths",
        type=json.loads,
        default=None,
        help=(
            "keep this static tree (JSON list of rank paths, e.g. one a replay with the lookup chain chose) "
            "instead of the table's best"
        ),
    )
    parser.add_argument(
        "--dynamic-max-nodes",
        type=int,
        default=DEFAULT_MAX_NODES,
        help="most nodes of the dynamic per-step tree written beside the static one (0: none)",
    )
    parser.add_argument(
        "--tokens-per-cost",
        type=float,
        default=DEFAULT_TOKENS_PER_COST,
        help="dynamic tree: expected tokens a unit of step cost must buy",
    )
    parser.add_argument(
        "--out", default=None, help=f"where to write the JSON (default: {TREE_FILE_NAME} in the heads folder)"
    )
    return parser


def load_model(args: argparse.Namespace):
    """(MedusaModel, tokenizer, heads source or None); fresh stand-in heads for --costs-only without heads."""
    dtype = parse_dtype(args.dtype)
    try:
        source = heads_source_for(args.model, args.heads)
    except MissingHeadsError:
        if not args.costs_only:
            raise
        base, tokenizer = load_target(args.model, dtype, "cpu")
        return MedusaModel.with_new_heads(base, COSTS_ONLY_NUM_HEADS).eval(), tokenizer, None
    model, tokenizer = load(
        args.model, heads=source, dtype=dtype, tree=[], prepack=False
    )  # packed once, for the largest tree, while timing
    return model, tokenizer, source


def topk_accuracy_for(args: argparse.Namespace, model: MedusaModel, tokenizer) -> tuple[list[list[float]], str]:
    """(accuracy[head][rank], where it came from)."""
    if args.measure_on:
        prompts = [chat_input_ids(tokenizer, prompt) for prompt in read_prompts(args.measure_on)]
        accuracy = measure_topk_accuracy(
            model, prompts, max_new_tokens=args.measure_tokens, max_rank=min(args.max_rank, model.guess_vocab_size)
        )
        return (
            accuracy,
            f"measured on {len(prompts)} prompts of {args.measure_on} ({args.measure_tokens} greedy tokens each)",
        )
    if args.costs_only:
        return [
            list(REFERENCE_TOPK_ACCURACY[min(d, len(REFERENCE_TOPK_ACCURACY) - 1)]) for d in range(model.num_heads)
        ], "reference (tree.py)"
    accuracy = model.heads.config.training_summary.get("topk_accuracy")
    if not accuracy:
        raise MedusaError(
            "the heads' training_summary has no 'topk_accuracy': pass --measure-on PROMPTS to measure it"
        )
    return accuracy, "heads' training_summary"


def output_path(args: argparse.Namespace, heads_source) -> Path | None:
    if args.out:
        return Path(args.out)
    if args.costs_only:
        return None
    if heads_source is not None and Path(heads_source).is_dir():
        return Path(heads_source) / TREE_FILE_NAME
    raise MedusaError("the heads are not a local folder: pass --out PATH for tree.json")


def calibrate(args: argparse.Namespace) -> Path | None:
    set_threads(args.threads)
    model, tokenizer, heads_source = load_model(args)
    out = output_path(args, heads_source)
    accuracy, accuracy_source = topk_accuracy_for(args, model, tokenizer)
    sizes = sorted(set(args.sizes) | {1})
    trees = trees_for_sizes(accuracy, sizes)
    prepack = not args.no_prepack and prepack_supported(model.base_model)
    costs = measure_step_costs(
        model, trees, prefix_tokens=args.prefix_tokens, repeats=args.repeats, warmup=args.warmup, prepack=prepack
    )
    rows = prediction_table(trees, costs, accuracy)
    chosen = None if args.costs_only else best_row(rows)
    print(
        f"{dtype_name(model.base_model.dtype)}, {torch.get_num_threads()} threads, "
        f"{args.prefix_tokens}-token cached prefix, "
        f"{'pre-packed linears (' + str(default_backend()) + ')' if prepack else 'unpacked linears'}, "
        f"accuracies: {accuracy_source}"
    )
    print(format_table(rows, chosen))
    if out is None:
        return None
    notes = {
        "chosen": asdict(chosen) if chosen is not None else None,
        "model": args.model or "default",
        "heads": str(heads_source) if heads_source is not None else None,
        "accuracy_source": accuracy_source,
        "topk_accuracy": accuracy,
        "prefix_tokens": args.prefix_tokens,
        "prepacked": prepack,
        "repeats": args.repeats,
        "machine": machine_info(model.base_model.dtype),
        "table": [asdict(row) for row in rows],
    }
    if chosen is None:  # a cost table, deliberately without "paths": not a tree file
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(notes, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}")
        return out
    static = (
        Tree.from_paths(args.static_paths) if args.static_paths is not None else trees[sizes.index(chosen.num_nodes)]
    )
    notes["static_paths_source"] = "--static-paths" if args.static_paths is not None else "the table's best"
    dynamic = dynamic_policy(rows, args.dynamic_max_nodes, args.tokens_per_cost)
    write_tree_file(out, static, notes, dynamic)
    print(
        f"wrote {out} ({static.num_nodes}-node static tree"
        + (f"; dynamic trees of up to {dynamic.max_nodes} nodes, what load() decodes with)" if dynamic else ")")
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    calibrate(build_parser().parse_args(argv))
    return 0
