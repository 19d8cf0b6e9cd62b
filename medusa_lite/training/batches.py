"""Training batches: the target's hidden states (from the cache or a live forward) and tokens for sample
indices, one step's forward through the objective, and the hidden-state cache prepared before the first step."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from medusa_lite.drafters.registry import kind_named
from medusa_lite.training import hidden_cache
from medusa_lite.training.config import GIGABYTE, TrainConfig
from medusa_lite.training.data import TokenizedData, collate
from medusa_lite.training.drafter_objective import states_width
from medusa_lite.training.losses import IGNORE, gather_rows, head_targets
from medusa_lite.training.objective import hidden_layers
from medusa_lite.training.setup import batch_layers


class BatchSource:
    """Hidden states (heads-only mode) or token batches (Medusa-2) for sample indices."""

    def __init__(
        self,
        samples,
        base_model,
        num_heads: int,
        with_teacher: bool,
        device,
        pad_id: int,
        cache: hidden_cache.HiddenCache | None = None,
        offset: int = 0,
        sequential: bool = False,
        layers: list[int] | None = None,
    ):
        self.samples = samples
        self.sequential = sequential  # a sequential drafter trains on whole sequences, not flattened rows
        self.base_model = base_model
        self.num_heads = num_heads
        self.with_teacher = with_teacher
        self.device = device
        self.pad_id = pad_id
        self.cache = cache
        self.offset = offset  # index of samples[0] in the cache
        self.layers = layers  # the target layers a batch holds (training.setup.batch_layers); None: the final one

    def tokens(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in collate([self.samples[i] for i in indices], self.pad_id).items()}

    def hidden_and_tokens(self, indices: list[int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The target's hidden states [B, T, W] of the batch (the final ones, or ``layers`` side by side; from the
        cache or a live forward) and its tokens.
        """
        batch = self.tokens(indices)
        if self.cache is not None:
            hidden = self.cache.batch_hidden([self.offset + i for i in indices], batch["input_ids"].shape[1]).to(
                self.device
            )
        else:
            with torch.no_grad():
                hidden = hidden_layers(self.base_model, batch["input_ids"], batch["attention_mask"], self.layers)
        return hidden, batch

    def rows(self, indices: list[int]):
        hidden, batch = self.hidden_and_tokens(indices)
        return gather_rows(hidden, batch["input_ids"], batch["loss_mask"], self.num_heads, self.with_teacher)


def forward_sequences(objective, source: BatchSource, indices: list[int], topk: int):
    """A sequential drafter's (loss, stats vector, positions trained)."""
    hidden, batch = source.hidden_and_tokens(indices)
    loss, vector = objective(hidden, batch["input_ids"], batch["loss_mask"], topk=topk)
    positions = int(
        (head_targets(batch["input_ids"], batch["loss_mask"], source.num_heads) != IGNORE).any(dim=-1).sum()
    )
    return loss, vector, positions


def forward_batch(objective, source: BatchSource, indices: list[int], medusa2: bool, topk: int = 1):
    """(loss, per-head stats vector counting ``topk`` ranks, Medusa-2 base KL or None, positions trained)."""
    if source.sequential:
        loss, vector, positions = forward_sequences(objective, source, indices, topk)
        return loss, vector, None, positions
    if medusa2:
        batch = source.tokens(indices)
        loss, vector = objective(batch["input_ids"], batch["attention_mask"], batch["loss_mask"], topk=topk)
        positions = int(
            (head_targets(batch["input_ids"], batch["loss_mask"], source.num_heads) != IGNORE).any(dim=-1).sum()
        )
        return loss, vector[:-1], vector[-1], positions
    rows = source.rows(indices)
    loss, vector = objective(rows.hidden, rows.targets, rows.teacher_hidden, path_tokens=rows.path_tokens, topk=topk)
    return loss, vector, None, int(rows.targets.shape[0])


def prepare_cache(config: TrainConfig, accelerator, base_model, data: TokenizedData, say: Callable[[str], None]):
    """Build (or reuse) the cache for train + held-out samples; return (cache, seconds spent building)."""
    samples = data.train + data.eval
    layers = batch_layers(config)
    width = states_width(layers, base_model.get_output_embeddings().weight.shape[1])
    cache_dir = config.cache_dir()
    name = f"{getattr(base_model.config, '_name_or_path', '') or config.model} ({base_model.dtype})"
    fingerprint_value = hidden_cache.fingerprint(
        samples,
        model_name=name,
        hidden_size=width,
        num_heads=config.num_heads,
        from_start=kind_named(config.drafter).training.unrolled,
        layers=layers,
    )
    from_start = kind_named(config.drafter).training.unrolled
    needed = hidden_cache.estimate_cache_bytes(samples, width, config.num_heads, from_start)
    info = hidden_cache.read_info(cache_dir)
    if info is not None and info.get("fingerprint") == fingerprint_value:
        say(f"hidden-state cache: reusing {cache_dir} ({needed / GIGABYTE:.3g} GB, {info['positions']} positions)")
        return hidden_cache.HiddenCache(cache_dir, samples, config.num_heads, from_start), 0.0
    action = "building" if info is None else "rebuilding (data, model or num_heads changed)"
    say(
        f"hidden-state cache: {action} {cache_dir}: {needed / GIGABYTE:.3g} GB in bfloat16 (max_cache_gb "
        f"{config.max_cache_gb})"
    )
    hidden_cache.check_size(needed, config.max_cache_gb, cache_dir)
    started = time.perf_counter()
    bar = tqdm(
        total=len(samples), desc="caching hidden states", disable=not accelerator.is_main_process, dynamic_ncols=True
    )
    device = accelerator.device

    def hidden_fn(batch):
        return hidden_layers(base_model, batch["input_ids"].to(device), batch["attention_mask"].to(device), layers)

    hidden_cache.build_cache(
        samples,
        hidden_fn,
        cache_dir,
        fingerprint_value=fingerprint_value,
        num_heads=config.num_heads,
        hidden_size=width,
        batch_size=config.batch_size,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        wait_for_everyone=accelerator.wait_for_everyone,
        progress=bar.update,
        from_start=from_start,
    )
    bar.close()
    seconds = time.perf_counter() - started
    tokens = sum(int(s.input_ids.numel()) for s in samples)
    say(
        f"hidden-state cache built in {seconds:.1f} s: body forwards over {tokens} tokens "
        f"({tokens / max(seconds, 1e-9):.0f} tokens/s over all ranks)"
    )
    return hidden_cache.HiddenCache(cache_dir, samples, config.num_heads, from_start), seconds
