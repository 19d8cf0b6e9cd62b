"""How much a trained sequential drafter uses the target's features: its held-out accuracy per depth with the
target's hidden states as they are, set to zero, or taken from another held-out sequence.

    python experiments/drafter_feature_use.py --drafter runs/smollm2-drafter/heads --eval 40 \
        --out benchmarks/drafter_signals/feature_use_ce.json

The held-out sequences are the first ``--eval`` of the split configs/smollm2_drafter.yaml gives
(the drafter never trained on them). Every variant runs the drafter exactly as training and
decoding do along a path that is right so far (``unrolled_features``); only the target features
of the committed pairs change (depth >= 2 still reads the drafter's own output features).
If accuracy barely falls without the features, the drafter is a small language model over the
tokens and the target's final hidden state adds little: then richer features (EAGLE-3's
low/mid/high layers) are where acceptance must come from.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from common import DRAFTER_CONFIG, config_split
from drafter_vs_heads_short import evaluate_drafter, hidden_states
from medusa_lite.artifacts.loading import load_target
from medusa_lite.bench.measure import machine_info
from medusa_lite.drafters.sequential.drafter import SequentialDrafter


def zeroed(states: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.zeros_like(state) for state in states]


def borrowed(states: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each sequence gets the features of the next one (cycled, cut or zero-padded to its length)."""
    out = []
    for index, state in enumerate(states):
        other = states[(index + 1) % len(states)][: state.shape[0]]
        padded = torch.zeros_like(state)
        padded[: other.shape[0]] = other
        out.append(padded)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafter", type=Path, required=True, help="a trained drafter folder")
    parser.add_argument("--eval", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    base, tokenizer = load_target(None, torch.float32, "cpu", attn_implementation="sdpa")
    base.eval().requires_grad_(False)
    held_out = config_split(DRAFTER_CONFIG, tokenizer).eval[: args.eval]
    states = hidden_states(base, held_out, 4)
    drafter = SequentialDrafter.from_pretrained(args.drafter).float().eval()
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    depth = drafter.config.depth
    results = {
        "drafter": str(args.drafter),
        "eval_sequences": len(held_out),
        "variants": {
            name: evaluate_drafter(drafter, held_out, features, embed, lm_head, depth)
            for name, features in (
                ("target_features", states),
                ("zero_features", zeroed(states)),
                ("features_of_another_sequence", borrowed(states)),
            )
        },
        "machine": machine_info(torch.float32),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results["variants"], indent=1))


if __name__ == "__main__":
    main()
