"""What one training run carries from step to step: its log (stdout, metrics.jsonl, trackers), the pieces
the trainer, the reporting and the publishing share (:class:`Run`), and what ``train`` returns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.training.batches import BatchSource
from medusa_lite.training.config import TrainConfig
from medusa_lite.training.data import TokenizedData
from medusa_lite.training.draft_vocab import DraftVocab

METRICS_NAME = "metrics.jsonl"


class RunLog:
    """stdout (through tqdm on the main process), metrics.jsonl and the trackers."""

    def __init__(self, accelerator, output_dir: Path):
        self.accelerator = accelerator
        self.path = output_dir / METRICS_NAME
        self.history: list[dict] = []

    def say(self, message: str) -> None:
        if self.accelerator.is_main_process:
            tqdm.write(message)

    def record(self, metrics: dict, step: int) -> None:
        entry = {"step": step, **metrics}
        self.history.append(entry)
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps(entry) + "\n")
        flat = {}
        for key, value in metrics.items():
            if isinstance(value, list):
                flat.update({f"{key}/head{k + 1}": v for k, v in enumerate(value) if not isinstance(v, list)})
            elif isinstance(value, (int, float)):
                flat[key] = value
        self.accelerator.log(flat, step=step)


@dataclass
class Run:
    """Everything the loop, the evaluation and the final save share."""

    config: TrainConfig
    accelerator: object
    log: RunLog
    data: TokenizedData
    heads: MedusaHeads | SequentialDrafter | HydraHeads
    objective: torch.nn.Module
    optimizer: object
    scheduler: object
    train_source: BatchSource
    eval_source: BatchSource
    root: Path
    total_steps: int
    steps_per_epoch: int
    data_position: dict
    save_kwargs: dict
    medusa2: bool
    cache_seconds: float = 0.0
    start_step: int = 0
    tokens_trained: int = 0
    draft_vocab: DraftVocab | None = None


@dataclass
class TrainResult:
    output_dir: Path
    heads_dir: Path
    adapter_dir: Path | None
    summary: dict
    history: list[dict] = field(default_factory=list)
    push_error: str | None = None
