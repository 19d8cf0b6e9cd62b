"""The sequential drafter's cost per step and how it grows with its tree (depth x topk), in plain steps.

    python experiments/drafter_cost_by_tree.py --threads 2 --out benchmarks/drafter_cost/costs.json

For each drafting depth and ``topk`` (nodes expanded per depth, children offered per node), the
package's own calibration (:func:`medusa_lite.trees.costs.measure_row_costs`) times, over a cached
128-token prefix of the default model in float32 (packed as ``load()`` packs it), a plain
one-token step and the drafter's whole per-step work as decoding does it
(:func:`~medusa_lite.drafters.sequential.proposer.drafter_proposal`: taking in 3 committed pairs, growing the
candidate tree ``depth`` deep, ranking it), the drafter set up by ``load``'s own
:func:`~medusa_lite.artifacts.loading.drafter_proposer_for` and packed for its rows. A drafter of the
default config's shape (``configs/smollm2_drafter.yaml``: draft vocabulary 8192) with fresh
weights stands in for a trained one: what its forwards cost does not depend on the weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from medusa_lite import DynamicTree, load
from medusa_lite.artifacts.loading import drafter_proposer_for
from medusa_lite.bench.measure import cpu_model
from medusa_lite.cpu.kernels import cpu_capability, kernel_path
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.drafters.sequential.proposer import drafter_proposal
from medusa_lite.trees.costs import measure_row_costs

DRAFT_VOCAB = 8192  # configs/smollm2_drafter.yaml
MAX_ROWS = 14  # what the default load() packs the target for
POLICY = DynamicTree(13, (1.0,))  # the drafter's default node budget; its costs are measured here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--topks", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--feature-layers", type=int, nargs="+", default=None, help="the drafter reads these target layers (EAGLE-3)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load()
    rows = []
    for depth in args.depths:
        config = DrafterConfig.for_model(
            model.base_model, depth=depth, draft_vocab_size=DRAFT_VOCAB, feature_layers=args.feature_layers
        )
        drafter = SequentialDrafter(config).eval()
        for topk in args.topks:  # set up (and packed for its rows) as load() does
            spec = drafter_proposer_for(model, drafter, POLICY, price_here=False, topk=topk)
            costs = measure_row_costs(model, MAX_ROWS, drafter_proposal(spec, model))
            row = {
                "depth": depth,
                "topk": topk,
                "drafting_ms": round(costs.proposal_cost * costs.plain_step_ms, 2),
                "drafting_in_plain_steps": round(costs.proposal_cost, 3),
                "plain_step_ms": round(costs.plain_step_ms, 2),
                "verify_8_rows_in_plain_steps": round(costs.row_costs[7], 3),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    machine = {
        "cpu": cpu_model(),
        "cpu_capability": cpu_capability(),
        "kernel": kernel_path().describe(),
        "threads": args.threads,
        "dtype": "float32",
        "feature_layers": args.feature_layers,
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
