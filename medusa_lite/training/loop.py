"""Head training, start to finish: checks, data, (cache), loop, evaluation, save, push.

Everything that can fail cheaply is checked before the first step (config.py, checks.py, the data
and cache modules); then the loop runs, evaluates on the held-out split and saves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from medusa_lite.artifacts.files import ADAPTER_DIR
from medusa_lite.drafters.hydra.heads import HydraConfig, HydraHeads
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.sequential.drafter import DrafterConfig, SequentialDrafter
from medusa_lite.extras import require_extra
from medusa_lite.training import checkpoint as ckpt
from medusa_lite.training import hidden_cache
from medusa_lite.training.checks import (
    HEADS_DIR,
    check_free_space,
    check_output_dir,
    check_tracker,
    estimate_output_bytes,
)
from medusa_lite.training.config import GIGABYTE, TrainConfig
from medusa_lite.training.data import TokenizedData, batch_indices, collate, load_training_data
from medusa_lite.training.draft_vocab import DraftVocab, choose_draft_vocab, measure_draft_vocab
from medusa_lite.training.drafter_objective import states_width
from medusa_lite.training.errors import NonFiniteLossError, TrainingDataError
from medusa_lite.training.losses import IGNORE, HeadStats, gather_rows, head_targets
from medusa_lite.training.objective import hidden_layers
from medusa_lite.training.setup import (
    batch_layers,
    build_objective,
    check_draft_vocab_fits,
    fill_deepspeed_config,
    fresh_heads,
    is_zero3,
    load_frozen_target,
    make_accelerator,
)

METRICS_NAME = "metrics.jsonl"
TRAIN_TOPK = 1  # training batches report top-1 only (top-k over the vocabulary costs time); eval reports top-k
COVERAGE_DIGITS = 4

# The module each kind of config saves as (write_heads).
ARTIFACT_CLASSES = {MedusaConfig: MedusaHeads, DrafterConfig: SequentialDrafter, HydraConfig: HydraHeads}


@dataclass
class TrainResult:
    output_dir: Path
    heads_dir: Path
    adapter_dir: Path | None
    summary: dict
    history: list[dict] = field(default_factory=list)
    push_error: str | None = None


# -- batches ------------------------------------------------------------------------------------


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


# -- evaluation ---------------------------------------------------------------------------------


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
    """One log line of held-out accuracy; a drafter that reads its own draft (``config.drafter`` sequential or
    hydra) is described per depth, Medusa heads per head."""
    unit = "head" if drafter == "medusa_heads" else "depth"
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


# -- logging ------------------------------------------------------------------------------------


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


# -- hidden-state cache -------------------------------------------------------------------------


def prepare_cache(config: TrainConfig, accelerator, base_model, data: TokenizedData, log: RunLog):
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
        from_start=config.drafter == "sequential",
        layers=layers,
    )
    from_start = config.drafter == "sequential"
    needed = hidden_cache.estimate_cache_bytes(samples, width, config.num_heads, from_start)
    info = hidden_cache.read_info(cache_dir)
    if info is not None and info.get("fingerprint") == fingerprint_value:
        log.say(f"hidden-state cache: reusing {cache_dir} ({needed / GIGABYTE:.3g} GB, {info['positions']} positions)")
        return hidden_cache.HiddenCache(cache_dir, samples, config.num_heads, from_start), 0.0
    action = "building" if info is None else "rebuilding (data, model or num_heads changed)"
    log.say(
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
    log.say(
        f"hidden-state cache built in {seconds:.1f} s: body forwards over {tokens} tokens "
        f"({tokens / max(seconds, 1e-9):.0f} tokens/s over all ranks)"
    )
    return hidden_cache.HiddenCache(cache_dir, samples, config.num_heads, from_start), seconds


# -- saving -------------------------------------------------------------------------------------


def write_heads(
    heads_config: MedusaConfig | DrafterConfig | HydraConfig, state: dict, heads_dir: Path, adapter_model=None
) -> None:
    """Save heads (or a drafter) atomically (temp folder, then rename) and check they load strictly.

    ``adapter_model`` (Medusa-2: the peft model whose adapter was trained) saves its adapter into
    the heads folder's ``adapter/`` (the layout of :mod:`medusa_lite.artifacts.files`).
    """
    module_class = ARTIFACT_CLASSES[type(heads_config)]
    heads = module_class(heads_config)
    heads.load_state_dict(
        {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    )  # draft ids stay integers
    temp = heads_dir.with_name(f".tmp-{heads_dir.name}")
    shutil.rmtree(temp, ignore_errors=True)
    heads.save_pretrained(temp)
    if adapter_model is not None:
        adapter_model.save_pretrained(str(temp / ADAPTER_DIR))
    ckpt.fsync_tree(temp)
    previous = heads_dir.with_name(f".old-{heads_dir.name}")
    if heads_dir.exists():  # a previous run's heads stay in place until the new ones are complete
        shutil.rmtree(previous, ignore_errors=True)
        os.rename(heads_dir, previous)
    os.rename(temp, heads_dir)
    shutil.rmtree(previous, ignore_errors=True)
    module_class.from_pretrained(heads_dir)


def heads_state(full_state: dict) -> dict:
    prefix = "heads."
    return {k[len(prefix) :]: v for k, v in full_state.items() if k.startswith(prefix)}


def weights_digest(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, parameter in sorted(module.named_parameters()):
        if parameter.requires_grad:
            digest.update(name.encode())
            digest.update(parameter.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def push(heads_dir: Path, repo_id: str, log: RunLog) -> str | None:
    """Upload the saved heads; a failure is reported, never raised (the heads stay on disk)."""
    try:
        from medusa_lite.artifacts.hub import push_heads_to_hub

        url = push_heads_to_hub(str(heads_dir), repo_id, token=None, private=False)
        log.say(f"pushed heads to {repo_id}: {url}")
        return None
    except Exception as error:  # network, auth, missing module: keep the saved heads either way
        message = (
            f"push to the Hub ({repo_id}) failed: {type(error).__name__}: {error}. The heads are saved in "
            f"{heads_dir}; push them later with medusa_lite.artifacts.hub.push_heads_to_hub({str(heads_dir)!r}, "
            f"{repo_id!r})"
        )
        log.say(message)
        return message


# -- the run ------------------------------------------------------------------------------------


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


def train(config: TrainConfig, *, resume: bool = False, push_to_hub: str | None = None) -> TrainResult:
    check_tracker(config)
    output_dir = Path(config.output_dir)
    check_output_dir(output_dir, resume, config.overwrite_output_dir)
    accelerator = make_accelerator(config)
    try:
        run = set_up(config, accelerator, output_dir, resume)
        tokens_trained, run_tokens, step_seconds = run_steps(run)
        final = (
            evaluate(run.objective, run.eval_source, len(run.data.eval), config, run.medusa2)
            if run.data.eval
            else None
        )
        summary = make_summary(run, tokens_trained, run_tokens, step_seconds, final)
        heads_dir, adapter_dir = save_results(run, summary, output_dir)
        push_error = push(heads_dir, push_to_hub, run.log) if push_to_hub and accelerator.is_main_process else None
        accelerator.wait_for_everyone()  # leave together: a rank tearing the process group down alone can abort
        return TrainResult(output_dir, heads_dir, adapter_dir, summary, run.log.history, push_error)
    finally:
        accelerator.end_training()  # closes trackers and the process group


def set_up(config: TrainConfig, accelerator, output_dir: Path, resume: bool) -> Run:
    require_extra("accelerate", "Training heads")
    from accelerate.utils import set_seed
    from transformers import get_scheduler

    set_seed(config.seed)
    log = RunLog(accelerator, output_dir)
    root = output_dir / ckpt.CHECKPOINTS_DIR
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and config.overwrite_output_dir and not resume:
        shutil.rmtree(root, ignore_errors=True)
        (output_dir / METRICS_NAME).unlink(missing_ok=True)

    base_model, tokenizer = load_frozen_target(config, accelerator)
    with accelerator.main_process_first():
        data = load_training_data(
            config.data,
            tokenizer,
            max_length=config.max_length,
            eval_fraction=config.eval_fraction,
            seed=config.seed,
            data_format=config.data_format,
        )
    log.say(data.stats.describe())
    if data.stats.truncated:
        log.say(
            f"note: {data.stats.truncated} sequence(s) were longer than max_length={config.max_length} and "
            "were truncated"
        )

    world = accelerator.num_processes
    steps_per_epoch = len(data.train) // (config.batch_size * world)
    if steps_per_epoch == 0:
        raise TrainingDataError(
            f"{len(data.train)} training sequences are fewer than one step's batch_size x processes = "
            f"{config.batch_size} x {world}; lower batch_size or add data"
        )
    total_steps = config.max_steps or config.epochs * steps_per_epoch

    draft_vocab = pick_draft_vocab(config, data, base_model.get_output_embeddings().weight.shape[0], log)
    heads = fresh_heads(config, base_model, None if draft_vocab is None else draft_vocab.token_ids)
    objective, base_for_batches = build_objective(config, base_model, heads)
    medusa2 = config.lora is not None

    cache_bytes = 0
    if config.precompute_hidden and hidden_cache.read_info(config.cache_dir()) is None:
        cache_bytes = hidden_cache.estimate_cache_bytes(
            data.train + data.eval,
            states_width(batch_layers(config), heads.config.hidden_size),
            config.num_heads,
            config.drafter == "sequential",
        )
    check_free_space(output_dir, estimate_output_bytes(config, objective, cache_bytes))
    cache, cache_seconds = None, 0.0
    if config.precompute_hidden:
        cache, cache_seconds = prepare_cache(config, accelerator, base_model, data, log)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with_teacher = config.distill_weight > 0
    sequential = config.drafter == "sequential"
    layers = batch_layers(config)

    def source_of(samples, offset: int) -> BatchSource:
        return BatchSource(
            samples,
            base_for_batches,
            config.num_heads,
            with_teacher,
            accelerator.device,
            pad_id,
            cache,
            offset,
            sequential,
            layers,
        )

    train_source, eval_source = source_of(data.train, 0), source_of(data.eval, len(data.train))

    trainable = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = get_scheduler(
        config.lr_scheduler, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=total_steps
    )
    fill_deepspeed_config(accelerator, config)
    objective, optimizer = accelerator.prepare(objective, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    save_kwargs = {"exclude_frozen_parameters": True} if accelerator.state.deepspeed_plugin is not None else {}
    data_position = {
        "train_sequences": len(data.train),
        "batch_size": config.batch_size,
        "num_processes": world,
        "seed": config.seed,
        "steps_per_epoch": steps_per_epoch,
    }
    run = Run(
        config,
        accelerator,
        log,
        data,
        heads,
        objective,
        optimizer,
        scheduler,
        train_source,
        eval_source,
        root,
        total_steps,
        steps_per_epoch,
        data_position,
        save_kwargs,
        medusa2,
        cache_seconds,
        draft_vocab=draft_vocab,
    )
    restore(run, resume)

    if config.wandb is not None:
        init = {
            "wandb": {
                k: v
                for k, v in {
                    "entity": config.wandb.entity,
                    "name": config.wandb.name,
                    "tags": config.wandb.tags or None,
                    "dir": str(output_dir),
                }.items()
                if v
            }
        }
        accelerator.init_trackers(config.wandb.project, config=config.to_dict(), init_kwargs=init)
    what = {
        "sequential": f"a sequential drafter ({config.num_heads} depths)",
        "hydra": f"{config.num_heads} Hydra-style heads",
    }.get(config.drafter, f"{config.num_heads} heads ({'Medusa-2: heads + LoRA' if medusa2 else 'heads only'})")
    log.say(
        f"training {what} on {'cached hidden states' if cache else 'live target forwards'} for {total_steps} steps "
        f"({steps_per_epoch} per epoch, batch {config.batch_size} x {world} process(es)) on {accelerator.device}"
    )
    return run


def pick_draft_vocab(config: TrainConfig, data: TokenizedData, vocab_size: int, log: RunLog) -> DraftVocab | None:
    """The draft vocabulary from the training split (every rank computes the same one), or None."""
    if config.draft_vocab_size is None:
        return None
    check_draft_vocab_fits(config, vocab_size)
    draft = choose_draft_vocab(data.train, data.eval, vocab_size, config.draft_vocab_size)
    held_out = f", {draft.eval_coverage:.2%} of held-out ones" if draft.eval_coverage is not None else ""
    log.say(
        f"draft vocabulary: the {config.draft_vocab_size} most frequent response tokens of {vocab_size} "
        f"cover {draft.train_coverage:.2%} of training response tokens{held_out}"
    )
    return draft


def restore(run: Run, resume: bool) -> None:
    """Drop interrupted checkpoint writes; with ``resume``, load the latest complete checkpoint."""
    accelerator, log = run.accelerator, run.log
    if accelerator.is_main_process:
        for entry in ckpt.remove_incomplete(run.root):
            log.say(f"ignored and removed an incomplete checkpoint (interrupted write): {entry}")
    accelerator.wait_for_everyone()
    if not resume:
        return
    latest = ckpt.latest_complete(run.root)
    if latest is None:
        log.say(f"--resume: no complete checkpoint in {run.root}; starting from step 0")
        return
    accelerator.load_state(str(latest[1]))
    state = ckpt.read_state(latest[1])
    run.start_step, run.tokens_trained = state["step"], state["tokens_trained"]
    if state.get("data_position") != run.data_position:
        log.say(
            f"warning: data or batch layout changed since the checkpoint ({state.get('data_position')} -> "
            f"{run.data_position}); the sample order after step {run.start_step} differs"
        )
    restored_ids = run.heads.draft_token_ids
    if run.draft_vocab is not None and not torch.equal(restored_ids.cpu(), run.draft_vocab.token_ids):
        log.say(
            "warning: the checkpoint's draft vocabulary differs from the one the current data give (the "
            "data changed); training continues with the checkpoint's"
        )
        run.draft_vocab = measure_draft_vocab(restored_ids, run.data.train, run.data.eval, run.heads.config.vocab_size)
    log.say(f"resuming from {latest[1]} at step {run.start_step}/{run.total_steps}")


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


def save_results(run: Run, summary: dict, output_dir: Path) -> tuple[Path, Path | None]:
    """Final heads (and adapter, in the heads folder); checks on the way that all ranks hold the same weights."""
    accelerator, log = run.accelerator, run.log
    heads_dir, adapter_dir = output_dir / HEADS_DIR, None
    full_state = accelerator.get_state_dict(run.objective)  # collective under ZeRO-3
    unwrapped = accelerator.unwrap_model(run.objective)
    if not is_zero3(accelerator):
        digests = gather_digests(accelerator, unwrapped)
        summary["ranks_in_sync"] = len(set(digests)) == 1
        log.say(
            f"trainable weights sha256 per rank: {digests} "
            f"({'in sync' if summary['ranks_in_sync'] else 'NOT IN SYNC'})"
        )
    if accelerator.is_main_process:
        adapter = {"backbone_adapter": True} if run.medusa2 else {}  # Medusa-2 trains Medusa heads only
        heads_config = dataclasses.replace(run.heads.config, training_summary=summary, **adapter)
        write_heads(heads_config, heads_state(full_state), heads_dir, unwrapped.model if run.medusa2 else None)
        log.say(f"saved heads to {heads_dir}")
        if run.medusa2:
            adapter_dir = heads_dir / ADAPTER_DIR
            log.say(f"saved the LoRA adapter to {adapter_dir} (load(model, heads={str(heads_dir)!r}) applies it)")
    accelerator.wait_for_everyone()
    return heads_dir, adapter_dir


def gather_digests(accelerator, module) -> list[str]:
    """Every rank's digest of its trainable weights (straight from torch.distributed, so that
    unsynchronised processes cannot hide behind a no-op gather)."""
    digest = weights_digest(module)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [digest]
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, digest)
    return gathered


def run_steps(run: Run) -> tuple[int, int, float]:
    """The optimisation loop.

    Returns (positions trained since step 0, positions trained by this run, seconds this run spent
    in training steps), positions summed over ranks.
    """
    config, accelerator, log, objective = run.config, run.accelerator, run.log, run.objective
    params = [p for p in objective.parameters() if p.requires_grad]
    interval = HeadStats.zeros(config.num_heads, TRAIN_TOPK)
    loss_sum, extra_sum, interval_steps, local_tokens, step_seconds = 0.0, 0.0, 0, 0, 0.0
    tokens_trained, run_tokens = run.tokens_trained, 0
    last_checkpoint = ckpt.latest_complete(run.root)
    bar = tqdm(
        total=run.total_steps,
        initial=run.start_step,
        desc="training heads",
        disable=not accelerator.is_main_process,
        dynamic_ncols=True,
    )
    objective.train()
    for step in range(run.start_step, run.total_steps):
        started = time.perf_counter()
        indices = batch_indices(
            step,
            num_samples=len(run.data.train),
            batch_size=config.batch_size,
            rank=accelerator.process_index,
            world_size=accelerator.num_processes,
            seed=config.seed,
        )
        loss, vector, extra, positions = forward_batch(objective, run.train_source, indices, run.medusa2)
        if config.debug_nan_at_step and step + 1 == config.debug_nan_at_step:
            loss = loss * float("nan")
        stop_if_not_finite(accelerator, loss, step + 1, run.steps_per_epoch, last_checkpoint)
        accelerator.backward(loss)
        if config.max_grad_norm > 0:
            accelerator.clip_grad_norm_(params, config.max_grad_norm)
        run.optimizer.step()
        run.scheduler.step()
        run.optimizer.zero_grad()
        step_seconds += time.perf_counter() - started

        done = step + 1
        interval.add(HeadStats.from_vector(vector.detach().double().cpu(), config.num_heads, TRAIN_TOPK))
        loss_sum += float(loss.detach())
        extra_sum += float(extra.detach()) if extra is not None else 0.0
        interval_steps += 1
        local_tokens += positions
        bar.update(1)
        if done % config.log_every == 0 or done == run.total_steps:
            stats = HeadStats.from_vector(
                accelerator.reduce(interval.as_vector().to(accelerator.device), "sum").cpu(),
                config.num_heads,
                TRAIN_TOPK,
            )
            losses = accelerator.reduce(
                torch.tensor([loss_sum, extra_sum], device=accelerator.device), "mean"
            ).tolist()
            metrics = train_metrics(
                stats, losses[0], interval_steps, losses[1] if run.medusa2 else None, run.scheduler.get_last_lr()[0]
            )
            log.record(metrics, step=done)
            bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", head1_top1=f"{metrics['train/head_top1'][0]:.3f}")
            interval = HeadStats.zeros(config.num_heads, TRAIN_TOPK)
            loss_sum, extra_sum, interval_steps = 0.0, 0.0, 0
        if config.eval_every and done % config.eval_every == 0 and done < run.total_steps and run.data.eval:
            report = accuracy_report(
                evaluate(objective, run.eval_source, len(run.data.eval), config, run.medusa2), config.topk
            )
            log.say(f"step {done}: " + describe_accuracy(report, config.topk, config.drafter))
            log.record({f"eval/{k}": v for k, v in report.items()}, step=done)
        if done % config.checkpoint_every == 0 or done == run.total_steps:
            new_tokens = int(accelerator.reduce(torch.tensor([local_tokens], device=accelerator.device), "sum").item())
            tokens_trained, run_tokens, local_tokens = tokens_trained + new_tokens, run_tokens + new_tokens, 0
            state = {
                "step": done,
                "epoch": done / run.steps_per_epoch,
                "tokens_trained": tokens_trained,
                "data_position": run.data_position,
                "config": config.to_dict(),
            }
            path = ckpt.save_checkpoint(accelerator, run.root, done, state, config.keep_checkpoints, **run.save_kwargs)
            last_checkpoint = (done, path)
        if config.debug_step_sleep_s:
            time.sleep(config.debug_step_sleep_s)
    bar.close()
    return tokens_trained, run_tokens, step_seconds


def stop_if_not_finite(accelerator, loss: torch.Tensor, step: int, steps_per_epoch: int, last_checkpoint) -> None:
    """All ranks agree (one all-reduce) and stop together before the bad loss touches any weight."""
    bad = torch.tensor([0.0 if torch.isfinite(loss.detach()).item() else 1.0], device=accelerator.device)
    if accelerator.reduce(bad, "sum").item() == 0:
        return
    where = (
        f"the last good checkpoint is {last_checkpoint[1]} (step {last_checkpoint[0]}); continue from it with --resume"
        if last_checkpoint
        else "no checkpoint had been written yet"
    )
    raise NonFiniteLossError(
        f"training loss is {float(loss.detach())} (not finite) at step {step} (epoch "
        f"{math.floor((step - 1) / steps_per_epoch) + 1}); "
        f"stopped before applying it, {where}. Common causes: learning_rate too high, bad data, float16 overflow"
    )
