"""Medusa heads, Hydra-style heads and the sequential drafter, side by side on the same data and budget.

    python experiments/hydra_ablation.py --steps 200 --eval 40 --out benchmarks/hydra_ablation/results.json

Three ways to guess tokens n+2 .. n+1+K from the target's final hidden state h_n at position n
and token n+1 (the target's own next token, known when drafting starts):

- ``medusa``: the package's heads as shipped (``MedusaHeads``, ``next_token_input``): head k reads
  [h_n; E(x_{n+1})] only, so it guesses depth k without knowing what depths < k guessed;
- ``hydra``: Hydra-style heads (Ankner et al. 2024): head k reads [h_n; E(x_{n+1}); ...;
  E(x_{n+k})], the tokens drafted before it (here the true ones: teacher forcing, as Hydra trains);
  the package's ``HydraHeads`` (:mod:`medusa_lite.drafters.hydra.heads`), otherwise built as the Medusa heads (one
  zero-initialised residual block, a linear input layer that starts as the identity on h_n, the
  draft vocabulary's rows of the frozen lm_head);
- ``drafter``: the package's sequential drafter (one decoder layer over its own earlier depths, with a
  KV cache over the whole text), reading the final hidden state as the heads do;
- ``drafter_layers``: the same drafter reading the target's layers 2, L/2 and L-3 instead
  (``feature_layers``, EAGLE-3's low / mid / high features, as ``configs/smollm2_drafter.yaml``).

All three train on the same sequences in the same order (the first ``--steps`` x ``--batch-size``
of the drafter recipe's training split, shuffled with the seed), with the same optimiser, learning
rate, schedule, loss weights (0.8^k) and draft vocabulary (the recipe's). Held-out: the first
``--eval`` sequences of the recipe's held-out split, every response position. ``top1`` at depth d
is the guess right given the true tokens before it (for ``medusa`` that is simply head d's top-1),
``chain_top1`` the top-1 right at every depth 1..d: what a greedy chain of that depth accepts whole,
comparable across the three. As the recipe's ``dtype: auto``: bfloat16 target and bf16 autocast on a
CPU with bfloat16 matrix units, float32 elsewhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from statistics import mean

import torch
from torch import nn

from drafter_multilayer import side_by_side_inputs, train_steps
from drafter_vs_heads_short import accuracy, batch_of, evaluate_drafter
from medusa_lite.bench.measure import machine_info
from medusa_lite.drafters.draft_vocab import draft_rows
from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.training.drafter_objective import DrafterObjective
from medusa_lite.training.losses import IGNORE, head_loss, head_targets, to_draft_targets
from medusa_lite.training.objective import LossSettings

VARIANTS = ("medusa", "hydra", "drafter", "drafter_layers")


def head_rows(hidden: torch.Tensor, batch: dict, depth: int, draft_ids: torch.Tensor, vocab_size: int):
    """The positions that train a head: h_n [P, H], tokens n+1 .. n+depth [P, depth], draft targets [P, depth]."""
    ids = batch["input_ids"]
    targets = head_targets(ids, batch["loss_mask"], depth)
    where = (targets != IGNORE).any(dim=-1)
    rows, positions = torch.nonzero(where, as_tuple=True)
    ahead = (positions[:, None] + torch.arange(1, depth + 1)).clamp(max=ids.shape[1] - 1)
    return (
        hidden[rows, positions],
        ids[rows[:, None], ahead],
        to_draft_targets(targets[rows, positions], draft_ids, vocab_size),
    )


def heads_hidden(kind: str, heads: nn.Module, hidden: torch.Tensor, path: torch.Tensor, embed: nn.Module):
    dtype = next(heads.parameters()).dtype
    if kind == "medusa":
        return heads(hidden.to(dtype), next_token_embeds=embed(path[:, 0]).to(dtype))
    return heads(hidden.to(dtype), embed(path).to(dtype))


def make_trainer(kind: str, model: nn.Module, embed: nn.Module, lm_head: nn.Module, weights: list[float]):
    """loss(hidden [B, T, H], batch) for one variant."""
    if kind.startswith("drafter"):
        objective = DrafterObjective(model, lm_head, embed, LossSettings(weights=weights))
        return lambda hidden, batch: objective(hidden, batch["input_ids"], batch["loss_mask"])[0]
    depth, vocab = len(weights), lm_head.weight.shape[0]
    rows_weight, rows_bias = draft_rows(lm_head, model.draft_token_ids)

    def loss(hidden, batch):
        h, path, targets = head_rows(hidden, batch, depth, model.draft_token_ids, vocab)
        out = heads_hidden(kind, model, h, path, embed)
        value, _ = head_loss(
            out,
            targets,
            lambda x: nn.functional.linear(x, rows_weight.to(x.dtype), rows_bias),
            weights=torch.tensor(weights),
        )
        return value

    return loss


def train(kind, model, samples, states, embed, lm_head, args) -> list[float]:
    step_loss = make_trainer(kind, model, embed, lm_head, [0.8**d for d in range(1, args.depth + 1)])
    return train_steps(model, step_loss, samples, states, args, label=f"{kind} ")


@torch.no_grad()
def evaluate_heads(kind, heads, samples, states, embed, lm_head, depth) -> dict:
    vocab = lm_head.weight.shape[0]
    rows_weight, rows_bias = draft_rows(lm_head, heads.draft_token_ids)
    guesses, targets = [], []
    for i in range(len(samples)):
        hidden, batch = batch_of(samples, states, [i])
        h, path, target = head_rows(hidden, batch, depth, heads.draft_token_ids, vocab)
        out = heads_hidden(kind, heads, h, path, embed).float()
        guesses.append(nn.functional.linear(out, rows_weight.float(), rows_bias).argmax(dim=-1))
        targets.append(target)
    return accuracy(torch.cat(guesses), torch.cat(targets))


def fresh_model(kind: str, base, depth: int, draft_ids: torch.Tensor, layers: list[int]) -> nn.Module:
    hidden, vocab = base.config.hidden_size, base.config.vocab_size
    if kind == "medusa":
        config = MedusaConfig(
            num_heads=depth,
            hidden_size=hidden,
            vocab_size=vocab,
            draft_vocab_size=draft_ids.numel(),
            next_token_input=True,
        )
        model = MedusaHeads(config)
        model.set_draft_vocab(draft_ids)
        return model
    if kind == "hydra":
        heads = HydraHeads(
            HydraConfig(num_heads=depth, hidden_size=hidden, vocab_size=vocab, draft_vocab_size=draft_ids.numel())
        )
        heads.set_draft_vocab(draft_ids)
        return heads
    config = DrafterConfig.for_model(base, depth=depth, draft_vocab_size=draft_ids.numel())
    if kind == "drafter_layers":
        config = dataclasses.replace(config, feature_layers=layers)
    drafter = SequentialDrafter(config)
    drafter.set_draft_vocab(draft_ids)
    return drafter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--eval", type=int, default=40)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    inputs = side_by_side_inputs(args)
    base, layers, samples, held_out = inputs.base, inputs.layers, inputs.samples, inputs.held_out
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    results = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "depth": args.depth,
        "learning_rate": args.learning_rate,
        "train_sequences": len(samples),
        "held_out_sequences": len(held_out),
        "feature_layers": layers,
        "variants": {},
    }
    for kind in args.variants:
        torch.manual_seed(args.seed)
        model = fresh_model(kind, base, args.depth, inputs.draft_ids, layers).float()
        states, eval_states = (
            (inputs.chosen, inputs.eval_chosen) if kind == "drafter_layers" else (inputs.finals, inputs.eval_finals)
        )
        tick = time.perf_counter()
        losses = train(kind, model, samples, states, embed, lm_head, args)
        seconds = time.perf_counter() - tick
        model.eval()
        if kind.startswith("drafter"):
            with torch.no_grad():
                held = evaluate_drafter(model, held_out, eval_states, embed, lm_head, args.depth)
        else:
            held = evaluate_heads(kind, model, held_out, eval_states, embed, lm_head, args.depth)
        held["greedy_chain_tokens"] = round(1 + sum(held["chain_top1"]), 3)  # the root token + expected accepted
        results["variants"][kind] = {
            "held_out": held,
            "weights": sum(p.numel() for p in model.parameters()),
            "first_25_loss": round(mean(losses[:25]), 3),
            "last_25_loss": round(mean(losses[-25:]), 3),
            "train_seconds": round(seconds, 1),
        }
        print(kind, json.dumps(results["variants"][kind]), flush=True)
    results["feature_seconds"] = round(inputs.feature_seconds, 1)
    results["machine"] = machine_info(inputs.dtype)
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
