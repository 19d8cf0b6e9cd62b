"""A SHORT CPU sanity run: train a sequential drafter on a few self-distilled sequences, then compare
its held-out accuracy per depth with the shipped Medusa heads' on the same held-out sequences.

    python experiments/drafter_vs_heads_short.py --train 100 --eval 30 --epochs 3 --out /tmp/drafter_vs_heads

The held-out sequences are the first ``--eval`` of the split configs/smollm2_heads.yaml gives (the
shipped heads never trained on them); the drafter trains on the first ``--train`` of that split's
training side, with the heads' draft vocabulary. Both are measured on the same positions:

- ``top1``: the guess at depth d is right (heads: head d's top-1; drafter: its depth-d top-1 given
  the true tokens before it, i.e. given the draft right so far);
- ``chain_top1``: the top-1 guesses at every depth 1..d are right: a greedy chain of depth d is
  accepted whole (the number that sets tokens per step).

This is a sanity check of the capability, far from the full recipe (which trains on all 5176
records: configs/smollm2_drafter.yaml). Results go to ``<out>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from common import HEADS_CONFIG, config_split
from medusa_lite.artifacts.loading import DEFAULT_HEADS_DIR, load_target
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.training.data import collate
from medusa_lite.training.drafter_objective import DrafterObjective, unrolled_features
from medusa_lite.training.losses import IGNORE, chain_hits, chain_positions, head_targets, to_draft_targets
from medusa_lite.training.objective import LossSettings, last_hidden


def hidden_states(base, samples, batch_size: int) -> list[torch.Tensor]:
    states = []
    for start in range(0, len(samples), batch_size):
        batch = collate(samples[start : start + batch_size])
        with torch.no_grad():
            hidden = last_hidden(base, batch["input_ids"], batch["attention_mask"])
        states += [hidden[row, : int(samples[start + row].input_ids.numel())] for row in range(hidden.shape[0])]
    return states


def batch_of(samples, states, indices):
    batch = collate([samples[i] for i in indices])
    hidden = torch.zeros(len(indices), batch["input_ids"].shape[1], states[0].shape[-1])
    for row, i in enumerate(indices):
        hidden[row, : states[i].shape[0]] = states[i]
    return hidden, batch


def accuracy(guesses: torch.Tensor, targets: torch.Tensor) -> dict:
    """guesses/targets [P, K] (draft indices; negative targets: none or out of the draft vocabulary)."""
    present = targets != IGNORE
    right = (guesses == targets) & (targets >= 0)
    chain_right, chain_present = chain_hits(right), chain_positions(targets)
    return {
        "top1": [round(float(right[:, d].sum() / present[:, d].sum()), 4) for d in range(targets.shape[1])],
        "chain_top1": [round(float(chain_right[d] / chain_present[d]), 4) for d in range(targets.shape[1])],
        "positions": int(present[:, 0].sum()),
    }


def evaluate_drafter(drafter, samples, states, embed, lm_head, depth):
    guesses, targets = [], []
    with torch.no_grad():
        for i in range(len(samples)):
            hidden, batch = batch_of(samples, states, [i])
            outputs = unrolled_features(drafter, hidden, batch["input_ids"], embed, depth)
            target = head_targets(batch["input_ids"], batch["loss_mask"], depth)[0]
            rows = (target != IGNORE).any(dim=-1)
            logits = drafter.project(torch.stack([o[0, rows] for o in outputs], dim=1), lm_head)
            guesses.append(logits.argmax(dim=-1))
            targets.append(to_draft_targets(target[rows], drafter.draft_token_ids, drafter.config.vocab_size))
    return accuracy(torch.cat(guesses), torch.cat(targets))


def evaluate_heads(heads, samples, states, embed, lm_head, depth):
    guesses, targets = [], []
    with torch.no_grad():
        for i in range(len(samples)):
            hidden, batch = batch_of(samples, states, [i])
            ids = batch["input_ids"][0]
            target = head_targets(batch["input_ids"], batch["loss_mask"], depth)[0]
            rows = torch.nonzero((target != IGNORE).any(dim=-1)).squeeze(-1)
            head_hidden = heads(
                hidden[0, rows], next_token_embeds=embed(ids[rows + 1]) if heads.config.next_token_input else None
            )
            guesses.append(heads.project(head_hidden, lm_head)[:, :depth].argmax(dim=-1))
            targets.append(to_draft_targets(target[rows], heads.draft_token_ids, heads.config.vocab_size))
    return accuracy(torch.cat(guesses), torch.cat(targets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=int, default=100)
    parser.add_argument("--eval", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/drafter_vs_heads"))
    parser.add_argument("--save", type=Path, default=None, help="also save the trained drafter folder here")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    base, tokenizer = load_target(None, torch.float32, "cpu", attn_implementation="sdpa")
    base.eval().requires_grad_(False)
    data = config_split(HEADS_CONFIG, tokenizer)
    train, held_out = data.train[: args.train], data.eval[: args.eval]
    print(
        f"{len(data.train)} / {len(data.eval)} sequences in the heads' split; using {len(train)} / {len(held_out)}",
        flush=True,
    )
    tick = time.perf_counter()
    train_states, eval_states = hidden_states(base, train, 4), hidden_states(base, held_out, 4)
    cache_seconds = time.perf_counter() - tick
    print(
        f"hidden states of {sum(s.shape[0] for s in train_states + eval_states)} positions in {cache_seconds:.0f} s",
        flush=True,
    )

    heads = MedusaHeads.from_pretrained(DEFAULT_HEADS_DIR).float().eval()
    embed, lm_head = base.get_input_embeddings(), base.get_output_embeddings()
    drafter = SequentialDrafter(
        DrafterConfig.for_model(base, depth=args.depth, draft_vocab_size=heads.config.draft_vocab_size)
    )
    drafter.set_draft_vocab(heads.draft_token_ids)
    objective = DrafterObjective(drafter, lm_head, embed, LossSettings(weights=[0.8**d for d in range(args.depth)]))
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=args.learning_rate)
    steps = args.epochs * (len(train) // args.batch_size)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.learning_rate, total_steps=steps, pct_start=0.1
    )
    tick, step = time.perf_counter(), 0
    for _epoch in range(args.epochs):
        order = torch.randperm(len(train)).tolist()
        for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
            hidden, batch = batch_of(train, train_states, order[start : start + args.batch_size])
            loss, _ = objective(hidden, batch["input_ids"], batch["loss_mask"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % 10 == 0:
                print(f"step {step}/{steps} loss {float(loss):.3f} ({time.perf_counter() - tick:.0f} s)", flush=True)
    train_seconds = time.perf_counter() - tick
    drafter.eval()
    results = {
        "label": (
            "SHORT CPU sanity run (not the recipe): drafter trained on few sequences vs shipped heads trained on 4917"
        ),
        "train_sequences": len(train),
        "eval_sequences": len(held_out),
        "epochs": args.epochs,
        "steps": steps,
        "batch_size": args.batch_size,
        "depth": args.depth,
        "hidden_state_seconds": round(cache_seconds, 1),
        "train_seconds": round(train_seconds, 1),
        "drafter": evaluate_drafter(drafter, held_out, eval_states, embed, lm_head, args.depth),
        "shipped_heads": evaluate_heads(
            heads, held_out, eval_states, embed, lm_head, min(args.depth, heads.config.num_heads)
        ),
        "total_seconds": round(time.perf_counter() - started, 1),
        "threads": torch.get_num_threads(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.save is not None:
        drafter.save_pretrained(args.save)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
