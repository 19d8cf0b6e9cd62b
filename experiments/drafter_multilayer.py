"""Does the sequential drafter accept more when it reads several of the target's layers (EAGLE-3's low / mid / high
features) instead of the final hidden state alone? Two drafters trained side by side on the same sequences, steps,
seed and order, then their held-out accuracy per depth (and, with ``--save``, both saved for decoding).

    python experiments/drafter_multilayer.py --steps 200 --out benchmarks/drafter_signals/multilayer.json \
        [--save runs/multilayer]     # then: experiments/spec_bench_acceptance.py --heads runs/multilayer/layers

- ``final``: the package's drafter as it is (depth 1 reads the target's final, post-norm hidden state).
- ``layers``: the same drafter with ``feature_layers`` (the package's option): depth 1 reads the
  hidden states after layers ``--layers`` (default: EAGLE-3's 2, L/2 and L-3), each
  RMS-normalised, concatenated and reduced to H by one more linear layer. Deeper depths read the
  drafter's own output, as before.

The data is the first ``--steps`` x ``--batch-size`` sequences of the training split
configs/smollm2_drafter.yaml gives (shuffled with the seed) and the first ``--eval`` of its held-out
split; the draft vocabulary is the recipe's (its ``draft_vocab_size`` most frequent response tokens
of the training split). As the training recipe's ``dtype: auto``: on a CPU with bfloat16 matrix
units (AMX or AVX512-BF16) the target runs in bfloat16 and the drafters' forwards under bf16
autocast, elsewhere everything in float32.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import torch

from common import DRAFTER_CONFIG, config_split
from drafter_vs_heads_short import batch_of, evaluate_drafter
from medusa_lite.artifacts.default_model import DEFAULT_MODEL_NAME
from medusa_lite.artifacts.loading import load_target
from medusa_lite.bench.measure import machine_info
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.training.config import load_config
from medusa_lite.training.data import collate
from medusa_lite.training.draft_vocab import choose_draft_vocab
from medusa_lite.training.drafter_objective import DrafterObjective
from medusa_lite.training.objective import LossSettings
from medusa_lite.training.setup import has_bf16_matrix_units


def target_features(base, samples, layers: list[int], batch_size: int) -> tuple[list, list]:
    """Per sequence: the final hidden state [T, H] and the chosen layers' [T, k*H] (in the target's dtype)."""
    finals, chosen = [], []
    for start in range(0, len(samples), batch_size):
        part = samples[start : start + batch_size]
        batch = collate(part)
        with torch.no_grad():
            out = base.get_decoder()(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
            )
        picked = torch.cat([out.hidden_states[layer] for layer in layers], dim=-1)
        for row, sample in enumerate(part):
            length = int(sample.input_ids.numel())
            finals.append(out.last_hidden_state[row, :length].clone())
            chosen.append(picked[row, :length].clone())
    return finals, chosen


def train(drafter, samples, states, embed, lm_head, args) -> list[float]:
    objective = DrafterObjective(drafter, lm_head, embed, LossSettings(weights=[0.8**d for d in range(1, 6)]))
    return train_steps(
        drafter,
        lambda hidden, batch: objective(hidden, batch["input_ids"], batch["loss_mask"])[0],
        samples,
        states,
        args,
    )


def train_steps(model, step_loss, samples, states, args, label: str = "") -> list[float]:
    """``args.steps`` steps of ``args.batch_size`` sequences in order: AdamW, a 10% warm-up then cosine, clipped
    gradients, bf16 autocast where ``args.bf16``. ``step_loss(hidden, batch)`` -> the loss of one batch."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    warmup = max(1, args.steps // 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses = []
    for step in range(args.steps):
        hidden, batch = batch_of(samples, states, list(range(step * args.batch_size, (step + 1) * args.batch_size)))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = step_loss(hidden, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if (step + 1) % 25 == 0:
            print(f"{label}step {step + 1}/{args.steps} loss {mean(losses[-25:]):.3f}", flush=True)
    return losses


@dataclass
class SideBySide:
    """What drafters trained side by side share: the target, the sequences, their features, the draft vocabulary."""

    base: torch.nn.Module
    dtype: torch.dtype
    samples: list
    held_out: list
    layers: list[int]
    finals: list  # per training sequence: the target's final hidden state [T, H]
    chosen: list  # ... and its ``layers``' hidden states [T, k*H]
    eval_finals: list
    eval_chosen: list
    draft_ids: torch.Tensor  # the recipe's draft vocabulary
    feature_seconds: float


def side_by_side_inputs(args, layers: list[int] | None = None) -> SideBySide:
    """The first ``args.steps x args.batch_size`` sequences of the drafter recipe's training split (shuffled with
    ``args.seed``) and its first ``args.eval`` held-out ones, with the target's features (``layers`` None: 2, L/2
    and L-3); the target in bfloat16 where the CPU has bfloat16 matrix units (then ``args.bf16``), else float32."""
    args.bf16 = has_bf16_matrix_units()
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    base, tokenizer = load_target(None, dtype, "cpu", attn_implementation="sdpa")
    base.eval().requires_grad_(False)
    num_layers = base.config.num_hidden_layers
    layers = layers or [2, num_layers // 2, num_layers - 3]
    data = config_split(DRAFTER_CONFIG, tokenizer)
    order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(args.seed)).tolist()
    samples = [data.train[i] for i in order[: args.steps * args.batch_size]]
    held_out = data.eval[: args.eval]
    tick = time.perf_counter()
    finals, chosen = target_features(base, samples, layers, 8)
    eval_finals, eval_chosen = target_features(base, held_out, layers, 8)
    feature_seconds = time.perf_counter() - tick
    print(f"target features of {len(samples) + len(held_out)} sequences in {feature_seconds:.0f} s", flush=True)
    recipe = load_config(DRAFTER_CONFIG)
    draft_ids = choose_draft_vocab(data.train, data.eval, base.config.vocab_size, recipe.draft_vocab_size).token_ids
    return SideBySide(
        base,
        dtype,
        samples,
        held_out,
        layers,
        finals,
        chosen,
        eval_finals,
        eval_chosen,
        torch.as_tensor(draft_ids),
        feature_seconds,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval", type=int, default=40)
    parser.add_argument("--layers", type=int, nargs="+", default=None, help="hidden_states indices (2 L/2 L-3)")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--save", type=Path, default=None, help="save both drafters to SAVE/final and SAVE/layers")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    inputs = side_by_side_inputs(args, args.layers)
    base, layers, samples, held_out = inputs.base, inputs.layers, inputs.samples, inputs.held_out
    finals, chosen, eval_finals, eval_chosen = inputs.finals, inputs.chosen, inputs.eval_finals, inputs.eval_chosen
    recipe = load_config(DRAFTER_CONFIG)
    config = DrafterConfig.for_model(base, depth=recipe.num_heads, draft_vocab_size=recipe.draft_vocab_size)
    config.base_model_name_or_path = DEFAULT_MODEL_NAME
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    variants = {
        "final": (lambda: SequentialDrafter(config), finals, eval_finals),
        "layers": (
            lambda: SequentialDrafter(dataclasses.replace(config, feature_layers=layers)),
            chosen,
            eval_chosen,
        ),
    }
    results = {"layers": layers, "steps": args.steps, "batch_size": args.batch_size, "variants": {}}
    for name, (fresh, states, eval_states) in variants.items():
        torch.manual_seed(args.seed)
        drafter = fresh().float()
        drafter.set_draft_vocab(inputs.draft_ids)
        tick = time.perf_counter()
        losses = train(drafter, samples, states, embed, lm_head, args)
        seconds = time.perf_counter() - tick
        drafter.eval()
        with torch.no_grad():
            held = evaluate_drafter(drafter, held_out, eval_states, embed, lm_head, drafter.config.depth)
        results["variants"][name] = {
            "held_out": held,
            "first_25_loss": round(mean(losses[:25]), 3),
            "last_25_loss": round(mean(losses[-25:]), 3),
            "train_seconds": round(seconds, 1),
        }
        print(name, json.dumps(results["variants"][name]), flush=True)
        if args.save is not None:
            drafter.config.training_summary = {
                "experiment": "experiments/drafter_multilayer.py",
                "steps": args.steps,
                "top1_accuracy": held["top1"],
                "chain_top1_accuracy": held["chain_top1"],
            }
            drafter.save_pretrained(args.save / name)
    results["feature_seconds"] = round(inputs.feature_seconds, 1)
    results["machine"] = machine_info(inputs.dtype)
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
