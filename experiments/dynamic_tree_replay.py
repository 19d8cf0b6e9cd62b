"""Dynamic trees against the static tree, by replaying greedy decoding offline.

    python experiments/lookup_policy_replay.py collect --n 120    # held-out prompts -> continuations (shared)
    python experiments/dynamic_tree_replay.py probabilities       # + each head's top-8 probabilities
    python experiments/dynamic_tree_replay.py replay              # policies -> replay_results.json

Same method as ``experiments/lookup_policy_replay.py`` (greedy decoding is deterministic: what a
step accepts depends only on the target's continuation, the heads' guesses and the lookup chain):
120 prompts of the heads' **held-out** training split (never Spec-Bench), their 48-token greedy
continuations, and at every position each head's top-8 guesses with their softmax probabilities.
Each policy is walked step by step with ``medusa_lite.generate``'s own pieces: the static tree
or :meth:`DynamicTree.choose` on the recorded probabilities (with ``chain_ranks`` of the lookup
chain ``lookup_chain`` picks: prompt lookup, else the shipped datastore), ``graft_chain``,
``accepted_path`` against the continuation. Each step is charged the relative cost of its row
count from the shipped ``tree.json`` (``infer/calibrate_tree.py``'s measurement on this machine);
predicted speed-up = one-row steps plain decoding needs / summed step costs (prefills left out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from common import OUTPUTS, REPO_ROOT
from lookup_policy_replay import CONTINUATIONS, MAX_NEW_TOKENS
from medusa_lite.artifacts.loading import DEFAULT_HEADS_DIR, TREE_FILE_NAME, load, read_tree_file
from medusa_lite.commands.options import set_threads
from medusa_lite.decoding.generate import (
    DEFAULT_DATASTORE_TOKENS,
    DEFAULT_LOOKUP_TOKENS,
    accepted_path,
    lookup_chain,
    tree_tokens,
)
from medusa_lite.proposers.datastore import DATASTORE_FILE_NAME, Datastore
from medusa_lite.trees.draft import draft_tree, graft_chain
from medusa_lite.trees.dynamic_tree import DynamicTree, chain_ranks
from medusa_lite.trees.tree import Tree

WITH_PROBABILITIES = OUTPUTS / "dynamic_tree" / "continuations.pt"
RESULTS = REPO_ROOT / "benchmarks" / "dynamic_tree" / "replay_results.json"
TOP_K = 8
STATIC_TREES = {
    "static 3 nodes [[0],[1]]": [[0], [1]],
    "static 4 nodes [[0],[1],[0,0]] (shipped before)": [[0], [1], [0, 0]],
    "static 5 nodes [[0],[1],[0,0],[0,0,0]]": [[0], [1], [0, 0], [0, 0, 0]],
    "static 8 nodes": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
}
DYNAMIC = [(max_nodes, tokens_per_cost) for max_nodes in (4, 6, 8) for tokens_per_cost in (1.5, 2.0, 2.5, 3.0)]


@torch.inference_mode()
def add_probabilities(continuations: Path, out: Path) -> None:
    """Each recorded position's top-8 head guesses with their probabilities (checked against the recorded guesses)."""
    model, _ = load()
    records = torch.load(continuations)
    for record in records:
        sequence, prompt_len = record["sequence"], record["prompt_len"]
        hidden = model.target_forward(sequence[None]).hidden[0]
        positions = torch.arange(prompt_len, sequence.numel())
        guesses, probabilities = model.head_topk_probabilities(
            hidden[positions - 1], TOP_K, model.num_heads, next_tokens=sequence[positions]
        )
        if not torch.equal(guesses, record["guesses"]):
            raise SystemExit(
                f"{continuations} was collected with other heads: rerun experiments/lookup_policy_replay.py collect"
            )
        record["probabilities"] = probabilities
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(records, out)
    print(f"wrote {len(records)} continuations with probabilities to {out}")


def replay_one(record: dict, policy: Tree | DynamicTree, cost, datastore: Datastore) -> tuple[int, int, float, int]:
    """(new tokens, steps, summed relative cost, verified rows) of greedy decoding one record with ``policy``."""
    sequence, prompt_len, guesses, probabilities = (
        record["sequence"],
        record["prompt_len"],
        record["guesses"],
        record["probabilities"],
    )
    total = sequence.numel() - prompt_len
    position, new_tokens, steps, summed, rows = prompt_len, 1, 0, 0.0, 0  # the prefill gives the first token
    num_heads = guesses.shape[1]
    while new_tokens < total:
        room = min(MAX_NEW_TOKENS - new_tokens - 1, total - new_tokens)
        chain, _ = lookup_chain(
            sequence[: position + 1], min(DEFAULT_LOOKUP_TOKENS, room), datastore, min(DEFAULT_DATASTORE_TOKENS, room)
        )
        step_policy = policy.pruned(min(room, num_heads))
        here = position - prompt_len
        if isinstance(step_policy, DynamicTree):
            ranks = step_policy.max_nodes - 1
            step_guesses = guesses[here, : step_policy.depth, :ranks]
            tree = step_policy.choose(
                probabilities[here, : step_policy.depth, :ranks].tolist(),
                chain_ranks(step_guesses, chain),
                chain.numel(),
            )
        else:
            tree = step_policy
        draft = graft_chain(draft_tree(tree, tree_tokens(tree, sequence[position], guesses[here])), chain)
        target_tokens = sequence[torch.clamp(position + 1 + draft.node_depths, max=sequence.numel() - 1)]
        accepted = accepted_path(draft, draft.tokens, target_tokens).numel() - 1
        new_tokens, position, steps = new_tokens + accepted + 1, position + accepted + 1, steps + 1
        summed += cost(draft.num_nodes)
        rows += draft.num_nodes
    return new_tokens, steps, summed, rows


def replay(continuations: Path, out: Path) -> None:
    records = torch.load(continuations)
    datastore = Datastore.load(DEFAULT_HEADS_DIR / DATASTORE_FILE_NAME)
    shipped = read_tree_file(DEFAULT_HEADS_DIR / TREE_FILE_NAME)
    if not isinstance(shipped, DynamicTree):
        raise SystemExit("the shipped tree.json has no dynamic policy to take the measured row costs from")
    cost = shipped.cost
    policies: dict[str, Tree | DynamicTree] = {name: Tree.from_paths(paths) for name, paths in STATIC_TREES.items()}
    for max_nodes, tokens_per_cost in DYNAMIC:
        policies[f"dynamic, up to {max_nodes} nodes, {tokens_per_cost} tokens per unit cost"] = DynamicTree(
            max_nodes, shipped.row_costs, tokens_per_cost
        )
    rows = []
    for name, policy in policies.items():
        new_tokens, steps, summed, verified = (
            sum(values) for values in zip(*(replay_one(record, policy, cost, datastore) for record in records))
        )
        after_prefill = new_tokens - len(records)  # tokens after each prefill, one plain step each
        rows.append(
            {
                "policy": name,
                "tokens_per_step": after_prefill / steps,
                "mean_verified_rows": verified / steps,
                "predicted_speedup": after_prefill / summed,
            }
        )
        print(
            f"{rows[-1]['predicted_speedup']:.3f}x  {rows[-1]['tokens_per_step']:.3f} tokens/step  "
            f"{rows[-1]['mean_verified_rows']:.1f} rows  {name}",
            flush=True,
        )
    rows.sort(key=lambda row: -row["predicted_speedup"])
    out.write_text(
        json.dumps({"records": len(records), "row_costs": list(shipped.row_costs), "results": rows}, indent=1) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["probabilities", "replay"])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    if args.command == "probabilities":
        add_probabilities(CONTINUATIONS, WITH_PROBABILITIES)
    else:
        replay(WITH_PROBABILITIES, RESULTS)


if __name__ == "__main__":
    main()
