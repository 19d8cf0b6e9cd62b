"""Reporting a run: held-out evaluation, accuracy reports and their log lines, training metrics, and the
``training_summary`` the artifact records."""

from __future__ import annotations

import torch

from medusa_lite.drafters.registry import kind_named
from medusa_lite.training.batches import BatchSource, forward_batch
from medusa_lite.training.config import TrainConfig
from medusa_lite.training.losses import HeadStats
from medusa_lite.training.run import Run

COVERAGE_DIGITS = 4


def evaluate(objective, source: BatchSource, num_samples: int, config: TrainConfig, medusa2: bool) -> HeadStats:
    """Per-head sums over the whole held-out split (every rank evaluates all of it: same result everywhere)."""
    k = config.num_heads
    stats = HeadStats.zeros(k, config.topk)
    objective.eval()
    with torch.no_grad():
        for start in range(0, num_samples, config.batch_size):
            indices = list(range(start, min(start + config.batch_size, num_samples)))
            _, vector, _, _ = forward_batch(objective, source, indices, medusa2, topk=config.topk)
            stats.add(HeadStats.from_vector(vector.detach().double().cpu(), k, config.topk))
    objective.train()
    return stats


def accuracy_report(stats: HeadStats, topk: int) -> dict:
    """Held-out accuracy per head (for a sequential drafter: per depth, given the earlier depths right), and the
    chain accuracy: top-1 right at every head (depth) 1..d, what a greedy chain of depth d accepts whole.
    """
    return {
        "top1_accuracy": [round(v, 4) for v in stats.top1()],
        f"top{topk}_accuracy": [round(v, 4) for v in stats.topk_cumulative()],
        "topk_accuracy": [[round(v, 4) for v in row] for row in stats.rank_accuracy()],
        "chain_top1_accuracy": [round(v, 4) for v in stats.chain_top1()],
        "eval_loss": [round(v, 4) for v in stats.mean_ce()],
        "eval_positions": [int(c) for c in stats.count.tolist()],
    }


def describe_accuracy(report: dict, topk: int, drafter: str) -> str:
    """One log line of held-out accuracy, per head or per depth as the kind ``drafter`` reports it."""
    unit = kind_named(drafter).training.unit
    pairs = [
        f"{unit} {k + 1}: {a:.3f}/{b:.3f}"
        for k, (a, b) in enumerate(zip(report["top1_accuracy"], report[f"top{topk}_accuracy"]))
    ]
    chain = " / ".join(f"{a:.3f}" for a in report["chain_top1_accuracy"])
    return (
        f"held-out top-1/top-{topk} accuracy: "
        + ", ".join(pairs)
        + f"; chain top-1 (right at every {unit} so far): {chain}"
    )


def train_metrics(stats: HeadStats, loss_sum: float, steps: int, extra_sum: float | None, lr: float) -> dict:
    metrics = {
        "train/loss": loss_sum / max(steps, 1),
        "train/head_ce": [round(v, 4) for v in stats.mean_ce()],
        "train/head_top1": [round(v, 4) for v in stats.top1()],
        "lr": lr,
    }
    if bool((stats.kl_sum > 0).any()):  # distilling: the KL to the target's distribution, per head (depth)
        metrics["train/head_kl"] = [round(v, 4) for v in (stats.kl_sum / stats.count.clamp(min=1)).tolist()]
    if extra_sum is not None:
        metrics["train/base_kl"] = extra_sum / max(steps, 1)
    return metrics


def make_summary(run: Run, tokens_trained: int, run_tokens: int, step_seconds: float, final: HeadStats | None) -> dict:
    """The ``training_summary`` stored in the heads' config.json (and shown on the model card)."""
    config, data = run.config, run.data
    summary = {
        "drafter": config.drafter,
        "data": data.stats.path,
        "data_records": data.stats.records,
        "train_sequences": len(data.train),
        "eval_sequences": len(data.eval),
        "truncated_sequences": data.stats.truncated,
        "skipped_records": data.stats.skipped,
        "steps": run.total_steps,
        "epochs": round(run.total_steps / run.steps_per_epoch, 3),
        "tokens_trained": tokens_trained,
        "batch_size": config.batch_size,
        "num_processes": run.accelerator.num_processes,
        "learning_rate": config.learning_rate,
        "head_loss_weights": [round(w, 4) for w in config.loss_weights()],
        "distill_weight": config.distill_weight,
        "feature_weight": config.feature_weight,
        "precompute_hidden": config.precompute_hidden,
        "medusa2_lora": None
        if config.lora is None
        else {"r": config.lora.r, "alpha": config.lora.alpha, "target_modules": list(config.lora.target_modules)},
        "train_tokens_per_second": round(run_tokens / step_seconds, 1) if step_seconds else None,
        "topk": config.topk,
    }
    if run.draft_vocab is not None:
        summary["draft_vocab_size"] = config.draft_vocab_size
        summary["draft_vocab_coverage"] = round(run.draft_vocab.train_coverage, COVERAGE_DIGITS)
        if run.draft_vocab.eval_coverage is not None:
            summary["draft_vocab_eval_coverage"] = round(run.draft_vocab.eval_coverage, COVERAGE_DIGITS)
    summary = {key: value for key, value in summary.items() if value is not None and value != {}}  # lean model card
    if run.cache_seconds:
        summary["hidden_cache_seconds"] = round(run.cache_seconds, 1)
    if final is not None:
        report = accuracy_report(final, config.topk)
        summary.update(report)
        run.log.say(describe_accuracy(report, config.topk, config.drafter))
        run.log.record({f"eval/{k}": v for k, v in report.items()}, step=run.total_steps)
    return summary
