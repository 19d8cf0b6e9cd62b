"""The trainer: a drafter's training run, start to finish: checks, data, (cache), steps, evaluation, save, push.

Everything that can fail cheaply is checked before the first step (config.py, checks.py, the data
and cache modules); then the steps run (checkpointed, resumable), the drafter is evaluated on the
held-out split (:mod:`~medusa_lite.training.reporting`) and saved through its kind
(:mod:`~medusa_lite.training.publishing`).
"""

from __future__ import annotations

import math
import shutil
import time
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm

from medusa_lite.drafters.registry import kind_named
from medusa_lite.extras import require_extra
from medusa_lite.training import checkpoint as ckpt
from medusa_lite.training import hidden_cache
from medusa_lite.training.batches import BatchSource, forward_batch, prepare_cache
from medusa_lite.training.checks import (
    check_free_space,
    check_output_dir,
    check_tracker,
    estimate_output_bytes,
    hold_run_lock,
)
from medusa_lite.training.config import TrainConfig
from medusa_lite.training.data import TokenizedData, batch_indices, load_training_data
from medusa_lite.training.draft_vocab import DraftVocab, choose_draft_vocab, measure_draft_vocab
from medusa_lite.training.drafter_objective import states_width
from medusa_lite.training.errors import CheckpointError, NonFiniteLossError, TrainingDataError
from medusa_lite.training.losses import HeadStats
from medusa_lite.training.publishing import push, save_results
from medusa_lite.training.reporting import accuracy_report, describe_accuracy, evaluate, make_summary, train_metrics
from medusa_lite.training.run import METRICS_NAME, Run, RunLog, TrainResult
from medusa_lite.training.setup import (
    batch_layers,
    build_objective,
    check_draft_vocab_fits,
    fill_deepspeed_config,
    fresh_heads,
    load_frozen_target,
    make_accelerator,
)

# accelerate's files for registered objects, which it unpickles with weights_only=False on load_state.
PICKLED_OBJECTS_PREFIX = "custom_checkpoint_"
TRAIN_TOPK = 1  # training batches report top-1 only (top-k over the vocabulary costs time); eval reports top-k


def train(config: TrainConfig, *, resume: bool = False, push_to_hub: str | None = None) -> TrainResult:
    check_tracker(config)
    output_dir = Path(config.output_dir)
    check_output_dir(output_dir, resume, config.overwrite_output_dir)
    accelerator = make_accelerator(config)
    run_lock = None
    try:
        run_lock = hold_run_lock(output_dir, accelerator)
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
        if run_lock is not None:
            run_lock.close()  # releases the run lock
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
            kind_named(config.drafter).training.unrolled,
        )
    check_free_space(output_dir, estimate_output_bytes(config, objective, cache_bytes))
    cache, cache_seconds = None, 0.0
    if config.precompute_hidden:
        cache, cache_seconds = prepare_cache(config, accelerator, base_model, data, log.say)

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with_teacher = config.distill_weight > 0
    sequential = kind_named(config.drafter).training.unrolled
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
    what = kind_named(config.drafter).training.describe(config)
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


def check_no_pickled_objects(folder: Path) -> None:
    """Refuse a checkpoint holding accelerate's pickled custom objects (``custom_checkpoint_*.pkl``, loaded with
    ``weights_only=False``: a file that runs code when resumed). medusa-lite writes none since it replays the
    schedule (:func:`replay_schedule`); older versions wrote the scheduler's state there."""
    pickled = sorted(path.name for path in folder.glob(f"{PICKLED_OBJECTS_PREFIX}*"))
    if pickled:
        raise CheckpointError(
            f"{folder} holds {', '.join(pickled)}: pickles that resuming would run (accelerate loads them with "
            "weights_only=False), so --resume refuses them (docs/security.md). If an older medusa-lite wrote this "
            "checkpoint on your machine, delete those files and resume again: the learning-rate schedule is "
            "replayed from the step count"
        )


def replay_schedule(scheduler, steps: int) -> None:
    """Bring the learning-rate schedule to where it was after ``steps`` steps by stepping it again: its state is a
    function of the step count, so a checkpoint does not carry it (accelerate would unpickle a registered object's
    state with ``weights_only=False``; docs/security.md)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
        for _ in range(steps):
            scheduler.step()


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
    check_no_pickled_objects(latest[1])
    state = ckpt.read_state(latest[1])
    ckpt.check_readable_files(latest[1])
    try:
        accelerator.load_state(str(latest[1]))
    except Exception as error:  # torch and accelerate raise many types for a corrupt optimizer or weights file
        raise CheckpointError(
            f"{latest[1]} could not be restored ({type(error).__name__}: {error}); {ckpt.CORRUPT_ADVICE}"
        ) from error
    run.start_step, run.tokens_trained = state["step"], state["tokens_trained"]
    replay_schedule(run.scheduler, run.start_step)
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
