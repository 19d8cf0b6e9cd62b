"""Head targets, losses and accuracy counts: small functions, tensors in, tensors out.

Alignment (the inference side's convention): the hidden state at position n gives the base
model's logits for token n+1; head k (k = 1..K) at position n guesses token n+1+k. Its target is
``input_ids[n+1+k]`` when that token is a response token, else ``IGNORE``. The optional
distillation target of head k at n is the base model's own distribution at position n+k (which
also predicts token n+1+k).

With a draft vocabulary (heads that guess among D tokens only), targets are draft indices and a
response token outside the draft vocabulary becomes ``OUT_OF_DRAFT``: it cannot be predicted, so
the cross-entropy skips it, but it still counts as a position in the accuracy denominators (a
miss at every rank), so held-out accuracy stays the honest fraction of tokens guessed right.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE = -100  # no target here (not a response token, or past the end)
OUT_OF_DRAFT = -1  # a response token the draft vocabulary lacks: a sure miss, excluded from the CE


def head_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, T] ids and response mask -> [B, T, K] targets (``IGNORE`` where there is none)."""
    batch, length = input_ids.shape
    targets = torch.full((batch, length, num_heads), IGNORE, dtype=torch.long, device=input_ids.device)
    for k in range(1, num_heads + 1):
        shift = k + 1
        if shift >= length:
            break
        ahead = input_ids[:, shift:]
        valid = loss_mask[:, shift:]
        targets[:, : length - shift, k - 1] = torch.where(valid, ahead, torch.full_like(ahead, IGNORE))
    return targets


def to_draft_targets(targets: torch.Tensor, draft_token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Full-vocabulary targets -> draft indices (``OUT_OF_DRAFT`` outside it; ``IGNORE`` stays)."""
    index_of = torch.full((vocab_size,), OUT_OF_DRAFT, dtype=torch.long, device=targets.device)
    index_of[draft_token_ids.to(targets.device)] = torch.arange(draft_token_ids.numel(), device=targets.device)
    mapped = index_of[targets.clamp(min=0)]
    return torch.where(targets == IGNORE, targets, mapped)


@dataclass
class Rows:
    """The positions of a batch that train at least one head, flattened."""

    hidden: torch.Tensor  # [P, H] hidden state at position n
    path_tokens: torch.Tensor  # [P, K] tokens n+1 .. n+K (clamped at the sequence's end): what head k reads
    targets: torch.Tensor  # [P, K]
    teacher_hidden: torch.Tensor | None  # [P, K, H] hidden state at position n+k (distillation)


def states_ahead(
    hidden: torch.Tensor, batch_index: torch.Tensor, position: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """The hidden state at n+k [P, K, H] of each row (n = ``position``) for k = 1..``num_heads``: what head (or
    drafting depth) k at n is distilled from.

    Positions past the sequence's end are clamped to it: those heads have no target there and count nowhere.
    """
    offsets = torch.arange(1, num_heads + 1, device=hidden.device)
    ahead = (position[:, None] + offsets[None, :]).clamp(max=hidden.shape[1] - 1)  # [P, K]
    return hidden[batch_index[:, None], ahead]


def gather_rows(
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    num_heads: int,
    with_teacher: bool,
    teacher_source: torch.Tensor | None = None,
) -> Rows:
    """[B, T, H] hidden states of a batch -> the rows that have a target for some head.

    The distillation rows come from ``teacher_source`` (default: ``hidden`` itself), taken at
    position n+k for head k.
    """
    targets = head_targets(input_ids, loss_mask, num_heads)
    batch_index, position = torch.nonzero((targets != IGNORE).any(dim=-1), as_tuple=True)
    teacher = None
    if with_teacher:
        source = hidden if teacher_source is None else teacher_source
        teacher = states_ahead(source, batch_index, position, num_heads)
    offsets = torch.arange(1, num_heads + 1, device=input_ids.device)
    # token n+1 exists (a row has a target at n+2 or later); later ones past the end have no target
    ahead = (position[:, None] + offsets[None, :]).clamp(max=input_ids.shape[1] - 1)
    return Rows(
        hidden=hidden[batch_index, position],
        path_tokens=input_ids[batch_index[:, None], ahead],
        targets=targets[batch_index, position],
        teacher_hidden=teacher,
    )


def kl_per_row(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) over the last dim, in float32."""
    teacher_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    student_logp = F.log_softmax(student_logits.float(), dim=-1)
    return (teacher_logp.exp() * (teacher_logp - student_logp)).sum(dim=-1)


def rank_hits(logits: torch.Tensor, targets: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[C, K, V] logits, [C, K] targets -> ([K, topk] count of targets found at each rank, [C, K] top-1 right).

    ``IGNORE`` and ``OUT_OF_DRAFT`` targets are never found (they are negative, ranks' indices are not).
    """
    top = logits.topk(min(topk, logits.shape[-1]), dim=-1).indices  # [C, K, topk]
    hits = (top == targets[..., None]) & (targets[..., None] >= 0)
    counts = hits.sum(dim=0)
    if counts.shape[-1] < topk:
        counts = F.pad(counts, (0, topk - counts.shape[-1]))
    return counts, hits[..., 0]


def chain_hits(top1_right: torch.Tensor) -> torch.Tensor:
    """[C, K] top-1 right per row and head (depth) -> [K]: rows right at every depth 1..d, what a greedy chain of
    depth d accepts whole."""
    return top1_right.int().cummin(dim=1).values.sum(dim=0)


def chain_positions(targets: torch.Tensor) -> torch.Tensor:
    """[P, K] targets -> [K]: rows with a target at every depth 1..d (the chain accuracy's denominator)."""
    return (targets != IGNORE).int().cummin(dim=1).values.sum(dim=0)


@dataclass
class HeadStats:
    """Sums over positions, per head: what the log and the evaluation report.

    ``count`` is every position with a target (the accuracy denominator); ``ce_count`` only those
    the heads can predict (the CE's): they differ by the targets outside a draft vocabulary.
    """

    ce_sum: torch.Tensor  # [K]
    kl_sum: torch.Tensor  # [K]
    count: torch.Tensor  # [K]
    ce_count: torch.Tensor  # [K]
    rank_hits: torch.Tensor  # [K, topk]
    chain_hits: torch.Tensor  # [K] positions whose top-1 is right at every head (depth) 1..d
    chain_count: torch.Tensor  # [K] positions with a target at every head (depth) 1..d

    @classmethod
    def zeros(cls, num_heads: int, topk: int, device=None) -> HeadStats:
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64, device=device)  # noqa: E731
        k = num_heads
        return cls(z(k), z(k), z(k), z(k), z(k, topk), z(k), z(k))

    def add(self, other: HeadStats) -> None:
        for name in self.__dataclass_fields__:
            getattr(self, name).add_(getattr(other, name).double())

    def as_vector(self) -> torch.Tensor:
        parts = (self.ce_sum, self.kl_sum, self.count, self.ce_count, self.rank_hits.flatten())
        return torch.cat([*parts, self.chain_hits, self.chain_count])

    @classmethod
    def vector_size(cls, num_heads: int, topk: int) -> int:
        return num_heads * (6 + topk)

    @classmethod
    def from_vector(cls, vector: torch.Tensor, num_heads: int, topk: int) -> HeadStats:
        k = num_heads
        if vector.numel() != cls.vector_size(k, topk):
            raise ValueError(
                f"a stats vector of {k} heads and top-{topk} has {cls.vector_size(k, topk)} values, got "
                f"{vector.numel()}"
            )
        ranks_end = 4 * k + k * topk
        return cls(
            vector[:k],
            vector[k : 2 * k],
            vector[2 * k : 3 * k],
            vector[3 * k : 4 * k],
            vector[4 * k : ranks_end].view(k, topk),
            vector[ranks_end : ranks_end + k],
            vector[ranks_end + k :],
        )

    def mean_ce(self) -> list[float]:
        """Mean CE over the targets the heads can predict (all of them without a draft vocabulary)."""
        return (self.ce_sum / self.ce_count.clamp(min=1)).tolist()

    def rank_accuracy(self) -> list[list[float]]:
        """[head][r]: probability that the head's rank-r guess is the target."""
        return (self.rank_hits / self.count.clamp(min=1)[:, None]).tolist()

    def top1(self) -> list[float]:
        return [row[0] for row in self.rank_accuracy()]

    def topk_cumulative(self) -> list[float]:
        return [sum(row) for row in self.rank_accuracy()]

    def chain_top1(self) -> list[float]:
        """[d]: fraction of positions whose top-1 guesses are right at every head (depth) 1..d."""
        return (self.chain_hits / self.chain_count.clamp(min=1)).tolist()


def chunk_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    teacher_logits: torch.Tensor | None,
    ce_scale: torch.Tensor,
    kl_scale: torch.Tensor,
    distill_weight: float,
    topk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Loss contribution and per-head sums of one chunk of rows (CE, KL, rank hits, chain hits).

    ``ce_scale[k]`` = head weight / number of predictable targets of head k in the whole batch
    (``kl_scale[k]``: / number of all its targets, ``OUT_OF_DRAFT`` included: the distribution
    is defined there too), so summing the chunks' losses gives the weighted means over the batch
    whatever the chunking.
    """
    num_rows, num_heads, vocab = logits.shape
    ce_targets = torch.where(targets == OUT_OF_DRAFT, IGNORE, targets)
    ce = F.cross_entropy(
        logits.reshape(-1, vocab).float(), ce_targets.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(num_rows, num_heads)
    ce_sum = ce.sum(dim=0)
    kl_sum = torch.zeros_like(ce_sum)
    if teacher_logits is not None:
        valid = (targets != IGNORE).float()
        kl_sum = (kl_per_row(logits, teacher_logits) * valid).sum(dim=0)
    loss = (ce_scale * ce_sum + distill_weight * kl_scale * kl_sum).sum()
    with torch.no_grad():
        hits, top1_right = rank_hits(logits.detach(), targets, topk)
    return loss, ce_sum.detach(), kl_sum.detach(), hits, chain_hits(top1_right)


def head_loss(
    head_hidden: torch.Tensor,
    targets: torch.Tensor,
    project: Callable[[torch.Tensor], torch.Tensor],
    *,
    weights: torch.Tensor,
    teacher_hidden: torch.Tensor | None = None,
    teacher_project: Callable[[torch.Tensor], torch.Tensor] | None = None,
    distill_weight: float = 0.0,
    topk: int = 5,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, HeadStats]:
    """Weighted CE (+ distillation) of all heads over rows, computed ``chunk_size`` rows at a time.

    ``head_hidden`` [P, K, H] are the heads' outputs; ``project`` maps them to logits [., K, V]
    (V: the draft vocabulary's size when the targets are draft indices).
    With more rows than ``chunk_size``, each chunk's logits are recomputed in the backward pass
    (activation checkpointing) so memory holds one chunk of [rows, K, vocab] logits, and there is
    still one backward call per step (needed by DDP and DeepSpeed).
    """
    count = (targets != IGNORE).sum(dim=0)
    ce_count = (targets >= 0).sum(dim=0)  # without OUT_OF_DRAFT
    weights = weights.to(head_hidden.device)
    ce_scale, kl_scale = weights / ce_count.clamp(min=1).float(), weights / count.clamp(min=1).float()
    use_teacher = teacher_hidden is not None and distill_weight > 0

    def run(rows_hidden: torch.Tensor, rows_targets: torch.Tensor, rows_teacher: torch.Tensor | None):
        teacher_logits = None
        if use_teacher:
            with torch.no_grad():
                teacher_logits = teacher_project(rows_teacher)
        return chunk_loss(project(rows_hidden), rows_targets, teacher_logits, ce_scale, kl_scale, distill_weight, topk)

    total = head_hidden.new_zeros((), dtype=torch.float32)
    stats = HeadStats.zeros(targets.shape[1], topk, device=head_hidden.device)
    num_rows = head_hidden.shape[0]
    for start in range(0, num_rows, chunk_size):
        part = slice(start, start + chunk_size)
        args = (head_hidden[part], targets[part], teacher_hidden[part] if use_teacher else None)
        if num_rows > chunk_size and torch.is_grad_enabled():
            loss, ce_sum, kl_sum, hits, chain = checkpoint(run, *args, use_reentrant=False)
        else:
            loss, ce_sum, kl_sum, hits, chain = run(*args)
        total = total + loss
        stats.ce_sum += ce_sum.double()
        stats.kl_sum += kl_sum.double()
        stats.rank_hits += hits.double()
        stats.chain_hits += chain.double()
    stats.count += count.double()
    stats.ce_count += ce_count.double()
    stats.chain_count += chain_positions(targets).double()
    return total, stats


def response_positions(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, position) of every position whose next token is a response token."""
    predicts_response = torch.zeros_like(loss_mask)
    predicts_response[:, :-1] = loss_mask[:, 1:]
    return torch.nonzero(predicts_response, as_tuple=True)


def chunked_kl(
    student_hidden: torch.Tensor, teacher_hidden: torch.Tensor, project: Callable, chunk_size: int
) -> torch.Tensor:
    """Mean over rows of KL(project(teacher) || project(student)), one chunk of logits at a time."""

    def run(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = project(teacher)
        return kl_per_row(project(student), teacher_logits).sum()

    num_rows = student_hidden.shape[0]
    total = student_hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, num_rows, chunk_size):
        part = slice(start, start + chunk_size)
        if num_rows > chunk_size and torch.is_grad_enabled():
            total = total + checkpoint(run, student_hidden[part], teacher_hidden[part], use_reentrant=False)
        else:
            total = total + run(student_hidden[part], teacher_hidden[part])
    return total / max(num_rows, 1)
