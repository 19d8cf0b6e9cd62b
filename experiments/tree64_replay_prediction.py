"""The replay's prediction for this tree (NOTES.md): tokens per target call and per decoding step on the
120 held-out self-distilled prompts of ``benchmarks/lookup_policy`` (run its ``collect`` first), for the
4-, 8- and 64-node trees, with the shipped prompt-lookup chain, without and with 4 datastore guesses.

    python experiments/tree64_replay_prediction.py
"""

import torch

import lookup_policy_replay as replay
from common import BENCHMARKS
from medusa_lite.artifacts.loading import read_tree_file
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.trees.tree import Tree


def main() -> None:
    records = torch.load(replay.CONTINUATIONS)
    datastore = Datastore.load(replay.DEFAULT_HEADS_DIR / replay.DATASTORE_FILE_NAME)
    shipped_chain = dict(zip((3, 2, 1), replay.SHIPPED_CHAIN))
    trees = {name: Tree.from_paths(replay.TREES[name]) for name in ("4 nodes", "8 nodes")} | {
        "64 nodes": read_tree_file(BENCHMARKS / "spec_bench_full_fp32_tree64" / "tree64.json")
    }
    for name, tree in trees.items():
        for datastore_tokens in (0, 4):
            # costs do not matter here: only tokens and target calls are read
            totals = [
                replay.replay_one(r, tree, shipped_chain, lambda rows: 1.0, datastore, datastore_tokens)
                for r in records
            ]
            new_tokens, calls, _ = (sum(values) for values in zip(*totals))
            per_step = (new_tokens - len(records)) / (calls - len(records))
            print(
                f"{name}, datastore {datastore_tokens}: {new_tokens / calls:.3f} tokens per call, "
                f"{per_step:.3f} per decoding step",
                flush=True,
            )


if __name__ == "__main__":
    main()
