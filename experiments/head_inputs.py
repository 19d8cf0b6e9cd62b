"""Do the heads gain from more than the last hidden state? A CPU-sized controlled experiment.

The shipped heads read the target's final hidden state at position n (and token n+1). Two richer
inputs, each added to that state through a zero-initialised layer (so training starts exactly at
the shipped heads):

- ``layers``: two intermediate layers' hidden states too (EAGLE-3 fuses low, middle and high
  features), each RMS-normalised, then one linear 2H -> H;
- ``attention``: one causal self-attention block over the final hidden states of the whole text
  so far (Hydra++'s "prefix attention"), pre-norm, output projection zero-initialised;

and ``deeper``: a second zero-initialised residual block on each trained head (more capacity,
same input); against ``control``: the shipped heads fine-tuned identically with nothing added (so
that more training is not mistaken for a better input). Same training sequences, order, steps and learning
rate for all; held-out top-1/top-3 per head on the heads' own held-out split (never trained on).

    python experiments/head_inputs.py cache --train 1200
    python experiments/head_inputs.py train --epochs 2 --tag 2epochs
    python experiments/head_inputs.py train --variants deeper --epochs 2 --tag deeper
    python experiments/head_inputs.py train --variants layers attention --epochs 4 --tag 4epochs
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from torch import nn

from common import BENCHMARKS, HEADS_CONFIG, OUTPUTS, REPO_ROOT
from medusa_lite.artifacts.loading import load
from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.drafters.medusa.heads import ResBlock
from medusa_lite.training.config import load_config
from medusa_lite.training.data import load_training_data
from medusa_lite.training.losses import IGNORE, HeadStats, head_loss, head_targets, to_draft_targets

CONFIG = HEADS_CONFIG
CACHE = OUTPUTS / "head_inputs" / "cache.pt"
RESULTS_DIR = BENCHMARKS / "head_inputs"  # results_<tag>.json
MID_LAYERS = (10, 20)  # of 30: hidden_states[i] is the residual stream after layer i
TRAINED_HEADS = 2  # heads 1 and 2: what the CPU tree's depths 1-2 use
TOPK = 3
HEAD_WEIGHTS = torch.tensor(load_config(CONFIG).loss_weights()[:TRAINED_HEADS])  # the recipe's: 0.8^k for head k
HEADS_LR_SCALE = 0.1  # the shipped heads are already trained: they move 10x slower than the new input layer


# -- cache -------------------------------------------------------------------------------------
@torch.inference_mode()
def build_cache(num_train: int, num_eval: int) -> None:
    config = load_config(CONFIG)
    model, tokenizer = load(datastore=False, prepack=False)
    data = load_training_data(
        [str(REPO_ROOT / p) for p in config.data],
        tokenizer,
        max_length=config.max_length,
        eval_fraction=config.eval_fraction,
        seed=config.seed,
    )
    train = random.Random(0).sample(data.train, num_train)
    held_out = data.eval[:num_eval]
    started, tokens = time.perf_counter(), 0
    records = {"train": [], "eval": []}
    for split, samples in (("train", train), ("eval", held_out)):
        for sample in samples:
            out = model.base_model(input_ids=sample.input_ids[None], output_hidden_states=True)
            states = out.hidden_states
            records[split].append(
                {
                    "input_ids": sample.input_ids,
                    "loss_mask": sample.loss_mask,
                    "last": states[-1][0].to(torch.bfloat16),
                    "mid": torch.cat([states[i][0] for i in MID_LAYERS], dim=-1).to(torch.bfloat16),
                }
            )
            tokens += sample.input_ids.numel()
        print(
            f"{split}: {len(samples)} sequences, {tokens} tokens so far, "
            f"{tokens / (time.perf_counter() - started):.0f} tokens/s",
            flush=True,
        )
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"records": records, "mid_layers": MID_LAYERS}, CACHE)


# -- the richer inputs -------------------------------------------------------------------------
class LayerFusion(nn.Module):
    """last + W [rms(mid_1); rms(mid_2)], W zero-initialised."""

    def __init__(self, hidden: int, num_mid: int):
        super().__init__()
        self.norm = nn.RMSNorm(hidden)
        self.proj = nn.Linear(num_mid * hidden, hidden)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, last: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
        parts = mid.unflatten(-1, (-1, last.shape[-1]))
        return last + self.proj(self.norm(parts).flatten(-2))


class PrefixAttention(nn.Module):
    """last + causal self-attention block over the sequence's final hidden states (out proj zero-initialised)."""

    def __init__(self, hidden: int, heads: int = 9, ffn: int = 1536):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(
            hidden, heads, ffn, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        for linear in (self.block.self_attn.out_proj, self.block.linear2):
            nn.init.zeros_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, last: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(last.shape[-2])
        return self.block(last[None], src_mask=mask, is_causal=True)[0]


class Control(nn.Module):
    def forward(self, last: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
        return last


def make_input(variant: str, hidden: int) -> nn.Module:
    return {
        "control": Control,
        "deeper": Control,
        "layers": lambda: LayerFusion(hidden, len(MID_LAYERS)),
        "attention": lambda: PrefixAttention(hidden),
    }[variant]()


def added_blocks(variant: str, heads) -> list[nn.Module]:
    """``deeper``: one more zero-initialised residual block on each trained head (the identity at first)."""
    if variant != "deeper":
        return []
    blocks = [ResBlock(heads.config.hidden_size) for _ in range(TRAINED_HEADS)]
    for k, block in enumerate(blocks):
        heads.heads[k].blocks.append(block)
    return blocks


# -- training ----------------------------------------------------------------------------------
def sequence_loss(
    front: nn.Module, heads, embed: nn.Module, draft_head: DraftLMHead, record: dict, vocab: int, topk: int = 1
) -> tuple[torch.Tensor, HeadStats]:
    """The training loss (``head_loss``, the library's) of heads 1..TRAINED_HEADS over one sequence's responses."""
    input_ids = record["input_ids"]
    targets = head_targets(input_ids[None], record["loss_mask"][None], TRAINED_HEADS)[0]
    rows = torch.nonzero((targets != IGNORE).any(-1)).squeeze(-1)
    hidden = front(record["last"].float(), record["mid"].float())[rows]
    head_hidden = heads(hidden, TRAINED_HEADS, next_token_embeds=embed(input_ids[rows + 1]))
    draft_targets = to_draft_targets(targets[rows], heads.draft_token_ids, vocab)
    return head_loss(head_hidden, draft_targets, draft_head, weights=HEAD_WEIGHTS, topk=topk)


def evaluate(front, heads, embed, draft_head, records, vocab) -> dict:
    stats = HeadStats.zeros(TRAINED_HEADS, TOPK)
    with torch.no_grad():
        for record in records:
            stats.add(sequence_loss(front, heads, embed, draft_head, record, vocab, TOPK)[1])
    return {"top1": stats.top1(), f"top{TOPK}": stats.topk_cumulative(), "positions": stats.count.tolist()}


def train_variant(variant: str, cache: dict, epochs: int, lr: float, batch: int) -> dict:
    torch.manual_seed(0)
    model, _ = load(datastore=False, prepack=False)
    heads, base = model.heads, model.base_model
    embed = base.get_input_embeddings()
    draft_head = DraftLMHead(base.get_output_embeddings(), heads.draft_token_ids)
    vocab = base.config.vocab_size
    front = make_input(variant, heads.config.hidden_size)
    new = [*front.parameters(), *(p for block in added_blocks(variant, heads) for p in block.parameters())]
    for p in base.parameters():
        p.requires_grad_(False)
    shipped = [
        *heads.next_token_fuse.parameters(),
        *(p for k in range(TRAINED_HEADS) for p in heads.heads[k].parameters() if not any(p is q for q in new)),
    ]
    trainable = new + shipped
    optimizer = torch.optim.AdamW(
        [{"params": new, "lr": lr}, {"params": shipped, "lr": lr * HEADS_LR_SCALE}], weight_decay=0.0
    )
    train, held_out = cache["records"]["train"], cache["records"]["eval"]
    before = evaluate(front, heads, embed, draft_head, held_out, vocab)
    started = time.perf_counter()
    steps = epochs * (len(train) // batch)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=[lr, lr * HEADS_LR_SCALE], total_steps=steps, pct_start=0.1
    )
    order = [i for epoch in range(epochs) for i in random.Random(epoch).sample(range(len(train)), len(train))]
    for step in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for index in order[step * batch : (step + 1) * batch]:
            loss, _ = sequence_loss(front, heads, embed, draft_head, train[index], vocab)
            (loss / batch).backward()
            total += loss.item() / batch
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        schedule.step()
        if step % 10 == 0:
            print(f"{variant} step {step}/{steps} loss {total:.3f} {time.perf_counter() - started:.0f}s", flush=True)
    after = evaluate(front, heads, embed, draft_head, held_out, vocab)
    extra = sum(p.numel() for p in new)
    return {
        "variant": variant,
        "before": before,
        "after": after,
        "extra_parameters": extra,
        "train_seconds": time.perf_counter() - started,
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("cache")
    c.add_argument("--train", type=int, default=1200)
    c.add_argument("--eval", type=int, default=259)
    t = sub.add_parser("train")
    t.add_argument("--variants", nargs="+", default=["control", "layers", "attention"])
    t.add_argument("--epochs", type=int, default=2)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--tag", default="run", help="results are written to results_<tag>.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.command == "cache":
        build_cache(args.train, args.eval)
        return
    cache = torch.load(CACHE)
    results = []
    for variant in args.variants:
        results.append(train_variant(variant, cache, args.epochs, args.lr, args.batch))
        print(json.dumps(results[-1]), flush=True)
        (RESULTS_DIR / f"results_{args.tag}.json").write_text(
            json.dumps(
                {
                    "settings": vars(args),
                    "mid_layers": list(MID_LAYERS),
                    "trained_heads": TRAINED_HEADS,
                    "train_sequences": len(cache["records"]["train"]),
                    "eval_sequences": len(cache["records"]["eval"]),
                    "results": results,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
