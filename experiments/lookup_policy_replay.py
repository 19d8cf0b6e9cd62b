"""Choose the prompt-lookup policy (and check the tree) by replaying greedy decoding offline.

    python experiments/lookup_policy_replay.py collect --n 120      # held-out prompts -> continuations
    python experiments/lookup_policy_replay.py costs                # step cost by verified rows
    python experiments/lookup_policy_replay.py replay               # every policy, predicted speed-up

Greedy decoding is deterministic, so what a decoding step accepts depends only on the target's
greedy continuation, the heads' ranked guesses at each position and the lookup chain, not on
timing. ``collect`` computes, for prompts of the heads' *held-out* training split (never
Spec-Bench), the target's greedy continuation and, at every position, each head's top-k guesses
(one forward over prompt + continuation; heads read the hidden state and the next token, as in
``medusa_lite.generate``). ``costs`` times one decoding step by number of verified rows on this
machine (sizes shuffled per repeat, medians). ``replay`` walks each continuation step by step for
every (tree, chain length per matched n-gram) pair: the candidates are built by ``generate``'s
own functions (tree guesses, then the lookup chain grafted as a trie), the accepted path is
``generate``'s acceptance rule against the continuation, and the step costs ``costs``' measured relative cost of
its row count. Predicted speed-up = one-row steps plain decoding needs / summed relative costs
(prefills left out: they are the same for both).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
from pathlib import Path

import torch

from common import HEADS_CONFIG, OUTPUTS, REPO_ROOT, config_split, random_prefix, timed_step
from medusa_lite.artifacts.loading import DEFAULT_HEADS_DIR, load
from medusa_lite.commands.options import set_threads
from medusa_lite.cpu.prepack import prepack_linears
from medusa_lite.decoding.cache import reserved_cache
from medusa_lite.decoding.generate import DEFAULT_LOOKUP_TOKENS, accepted_path, generate, lookup_chain, tree_tokens
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME, Datastore
from medusa_lite.proposers.lookup import copy_after_match, latest_match
from medusa_lite.trees.draft import draft_tree, graft_chain
from medusa_lite.trees.tree import Tree

RESULTS_DIR = REPO_ROOT / "benchmarks" / "lookup_policy"
CONFIG = HEADS_CONFIG
CONTINUATIONS = OUTPUTS / "lookup_policy" / "continuations.pt"
COSTS = RESULTS_DIR / "step_costs.json"
RESULTS = RESULTS_DIR / "replay_results.json"
TOP_K = 8
MAX_NEW_TOKENS = 48
COST_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16)
COST_PREFIXES = (150, 500)
COST_REPEATS, COST_WARMUP = 30, 3
COST_PACKED_ROWS = 16
TREES = {
    "1 node (lookup only)": [],
    "2 nodes": [[0]],
    "3 nodes": [[0], [1]],
    "3 nodes, chain": [[0], [0, 0]],
    "4 nodes": [[0], [1], [0, 0]],
    "4 nodes, flat": [[0], [1], [2]],
    "5 nodes": [[0], [1], [0, 0], [0, 0, 0]],
    "6 nodes": [[0], [1], [2], [0, 0], [0, 0, 0]],
    "8 nodes": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
}
CHAIN_LENGTHS = [
    (l3, l2, l1)
    for l3, l2, l1 in itertools.product([0, 1, 2, 3, 4, 6, 8], [0, 1, 2, 3, 4, 6], [0, 1, 2, 3])
    if l3 >= l2 >= l1
]
# Datastore guesses per step (medusa_lite.proposers.datastore; the shipped file holds the training split's
# answers only), replayed with every tree and generate's own lookup_chain: its prompt-lookup chains
# (2 per matched token, at most DEFAULT_LOOKUP_TOKENS = 6) are these lengths.
SHIPPED_CHAIN = (6, 4, 2)
DATASTORE_TOKENS = (2, 3, 4, 5, 6, 8)
POLICIES = [(tree, chain, 0) for tree, chain in itertools.product(TREES, CHAIN_LENGTHS)] + [
    (tree, SHIPPED_CHAIN, tokens) for tree, tokens in itertools.product(TREES, DATASTORE_TOKENS)
]


# -- collect -----------------------------------------------------------------------------------
@torch.inference_mode()
def collect(n: int, out: Path) -> None:
    model, tokenizer = load()
    held_out = config_split(CONFIG, tokenizer).eval
    records = []
    for index in random.Random(0).sample(range(len(held_out)), min(n, len(held_out))):
        sample = held_out[index]
        prompt = sample.input_ids[: int(torch.nonzero(sample.loss_mask)[0])]
        sequence = generate(model, prompt, MAX_NEW_TOKENS).sequences[0]  # = plain greedy (tested)
        hidden = model.target_forward(sequence[None]).hidden[0]
        positions = torch.arange(prompt.numel(), sequence.numel())
        guesses = model.head_topk(hidden[positions - 1], TOP_K, model.num_heads, next_tokens=sequence[positions])
        records.append({"sequence": sequence, "prompt_len": prompt.numel(), "guesses": guesses})
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(records, out)
    print(f"wrote {len(records)} continuations to {out}")


# -- costs -------------------------------------------------------------------------------------
@torch.inference_mode()
def measure_costs(out: Path) -> None:
    model, _ = load()
    prepack_linears(model.base_model, COST_PACKED_ROWS)
    trees = {size: Tree.from_paths([[rank] for rank in range(size - 1)]) for size in COST_SIZES}
    relative: dict[int, dict[int, float]] = {}
    for prefix_tokens in COST_PREFIXES:
        prefix = random_prefix(model.config.vocab_size, prefix_tokens)
        cache = reserved_cache(model, prefix_tokens + max(COST_SIZES))
        prefill = model.target_forward(prefix[None], cache=cache, use_cache=True)
        root, hidden = prefill.logits[0, -1:].argmax(-1), prefill.hidden[0, -1]
        samples: dict[int, list[float]] = {size: [] for size in COST_SIZES}
        shuffler = random.Random(0)
        for repeat in range(COST_WARMUP + COST_REPEATS):
            for size in shuffler.sample(COST_SIZES, len(COST_SIZES)):
                _, seconds = timed_step(model, cache, hidden, root, trees[size])
                if repeat >= COST_WARMUP:
                    samples[size].append(seconds)
        medians = {size: statistics.median(times) for size, times in samples.items()}
        relative[prefix_tokens] = {size: medians[size] / medians[1] for size in COST_SIZES}
        print(prefix_tokens, {size: round(cost, 2) for size, cost in relative[prefix_tokens].items()})
    mean = {size: statistics.mean(relative[p][size] for p in COST_PREFIXES) for size in COST_SIZES}
    out.write_text(
        json.dumps(
            {
                "threads": torch.get_num_threads(),
                "packed_rows": COST_PACKED_ROWS,
                "by_prefix": relative,
                "relative_cost": mean,
            },
            indent=1,
        )
        + "\n"
    )


# -- replay ------------------------------------------------------------------------------------
def replay_one(
    record: dict,
    tree: Tree,
    chain_lengths: dict[int, int],
    cost,
    datastore: Datastore | None = None,
    datastore_tokens: int = 0,
) -> tuple[int, int, float]:
    """(new tokens, target calls incl. prefill, summed relative step cost) of greedy decoding one record.

    Each step builds its candidates with ``generate``'s own functions (the heads' guesses on the
    tree, the lookup chain grafted on) and accepts with its rule, the target's token after each
    node being the continuation's next token (what greedy verification returns on the true path).
    With ``datastore_tokens`` the chain is ``generate``'s own ``lookup_chain`` (whose prompt-lookup
    lengths are SHIPPED_CHAIN) and ``chain_lengths`` is not used.
    """
    sequence, prompt_len, guesses = record["sequence"], record["prompt_len"], record["guesses"]
    total = sequence.numel() - prompt_len
    position, new_tokens, calls, summed = prompt_len, 1, 1, 0.0  # the prefill gives the first token
    while new_tokens < total:
        room = min(MAX_NEW_TOKENS - new_tokens - 1, total - new_tokens)
        step_tree = tree.pruned(room)
        history = sequence[: position + 1]  # what generate has committed: a chain never copies past it
        if datastore_tokens:  # generate's own choice between the text's match and the datastore
            chain, _ = lookup_chain(history, min(DEFAULT_LOOKUP_TOKENS, room), datastore, min(datastore_tokens, room))
        else:
            n, follow = latest_match(history)
            chain = copy_after_match(history, n, follow, min(chain_lengths.get(n, 0), room))
        draft = graft_chain(
            draft_tree(step_tree, tree_tokens(step_tree, sequence[position], guesses[position - prompt_len])), chain
        )
        target_tokens = sequence[torch.clamp(position + 1 + draft.node_depths, max=sequence.numel() - 1)]
        accepted = accepted_path(draft, draft.tokens, target_tokens).numel() - 1
        new_tokens, position, calls = new_tokens + accepted + 1, position + accepted + 1, calls + 1
        summed += cost(draft.num_nodes)
    return new_tokens, calls, summed


def replay(continuations: Path, costs: Path, out: Path) -> None:
    records = torch.load(continuations)
    datastore = Datastore.load(DEFAULT_HEADS_DIR / DATASTORE_FILE_NAME)
    relative = {int(size): value for size, value in json.loads(costs.read_text())["relative_cost"].items()}
    largest = max(relative)

    def cost(rows: int) -> float:
        fits = [size for size in relative if size >= rows]
        return relative[min(fits)] if fits else relative[largest] * rows / largest

    rows = []
    for name, lengths, datastore_tokens in POLICIES:
        totals = [
            replay_one(
                record, Tree.from_paths(TREES[name]), dict(zip((3, 2, 1), lengths)), cost, datastore, datastore_tokens
            )
            for record in records
        ]
        new_tokens, calls, summed = (sum(values) for values in zip(*totals))
        plain_steps = new_tokens - len(records)  # tokens after each prefill, one step each
        rows.append(
            {
                "tree": name,
                "chain_for_3_2_1_gram": list(lengths),
                "datastore_tokens": datastore_tokens,
                "mean_accepted_tokens": new_tokens / calls,
                "predicted_speedup": plain_steps / summed,
            }
        )
    rows.sort(key=lambda row: -row["predicted_speedup"])
    out.write_text(json.dumps({"records": len(records), "costs": str(costs.name), "results": rows}, indent=1) + "\n")
    for row in rows[:15]:
        print(
            f"{row['predicted_speedup']:.3f}x  {row['mean_accepted_tokens']:.2f} tokens/step  {row['tree']:22s} "
            f"chain {row['chain_for_3_2_1_gram']} datastore {row['datastore_tokens']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["collect", "costs", "replay"])
    parser.add_argument("--n", type=int, default=120, help="collect: held-out prompts")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    if args.command == "collect":
        collect(args.n, CONTINUATIONS)
    elif args.command == "costs":
        measure_costs(COSTS)
    else:
        replay(CONTINUATIONS, COSTS, RESULTS)


if __name__ == "__main__":
    main()
