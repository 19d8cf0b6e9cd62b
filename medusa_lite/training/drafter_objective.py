"""Training a sequential drafter: every position of a sequence at once, depth after depth.

"Training-time test" (EAGLE-3): depth d's rows read the output features depth d-1 produced (not
the target's), paired with the true token, and attend causally to the true pairs plus their own
position's rows of the earlier depths (:func:`~medusa_lite.drafters.sequential.drafter.causal_plus_own_attention`).
That is exactly what decoding computes along a drafted path whose tokens are right so far, which
is the only path that can still be accepted: so the held-out accuracy of depth d here is the
drafter's accuracy at depth d *given depths < d right*, as at inference, and the chain accuracy
(top-1 right at every depth 1..d) is the fraction of positions where a greedy chain of depth d
would be accepted whole.

Alignment (as for Medusa heads, :mod:`medusa_lite.training.losses`): the target's hidden state at
position t is paired with token x_{t+1}; depth d at t guesses x_{t+1+d}; its input token is
x_{t+d} and its position t + d - 1.

The batch's target states per position are the features depth 1 reads (the final hidden state,
or the drafter's ``feature_layers`` side by side), then, when a loss below reads the final hidden
state and the features are other layers, the final hidden state too (:func:`state_layers`).

Besides the data's tokens, the target's own hidden state h_{t+d} (already in the batch: the cache
keeps every position) teaches depth d at t two more things, each with its own weight:

- ``distill_weight``: KL(target's distribution of x_{t+1+d} || drafter's), over the draft
  vocabulary: every rank, not only the top-1 a token names (what a tree's siblings need);
- ``feature_weight`` (EAGLE-1's feature regression): smooth-L1 between the drafter's normalised
  output feature and h_{t+d}, the feature the target itself would hand the next depth: H numbers
  per position instead of one token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.drafters.sequential.drafter import SequentialDrafter, causal_plus_own_attention
from medusa_lite.training.losses import IGNORE, head_loss, head_targets, states_ahead, to_draft_targets
from medusa_lite.training.objective import LossSettings, teacher_logits


def state_layers(feature_layers: list[int] | None, reads_target_ahead: bool) -> list[int] | None:
    """The target layers a drafter's batch holds per position (:func:`~medusa_lite.training.objective.hidden_layers`):
    None for the final hidden state alone; else the feature layers, then the final one (-1) when the loss reads it.
    """
    if feature_layers is None:
        return None
    return [*feature_layers, -1] if reads_target_ahead else list(feature_layers)


def states_width(layers: list[int] | None, hidden_size: int) -> int:
    """Values per position a batch of :func:`state_layers` ``layers`` holds: ``hidden_size`` per layer."""
    return hidden_size * (1 if layers is None else len(layers))


def shifted_tokens(input_ids: torch.Tensor, shift: int) -> torch.Tensor:
    """input_ids [B, T] moved ``shift`` places left, padded with token 0 (rows past the end have no target)."""
    shifted = torch.zeros_like(input_ids)
    if shift < input_ids.shape[1]:
        shifted[:, : input_ids.shape[1] - shift] = input_ids[:, shift:]
    return shifted


def feature_regression(rows: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor):
    """Weighted mean over depths of the smooth-L1 between normalised output features and the target's, [P, K, H] each.

    ``valid`` [P, K]: depths with a target; each depth's mean is over its own valid rows.
    """
    per_row = F.smooth_l1_loss(rows.float(), teacher.float(), reduction="none").mean(dim=-1)  # [P, K]
    valid = valid.float()
    per_depth = (per_row * valid).sum(dim=0) / valid.sum(dim=0).clamp(min=1)
    return (weights.to(per_depth.device) * per_depth).sum()


def unrolled_features(
    drafter: SequentialDrafter, hidden: torch.Tensor, input_ids: torch.Tensor, embed: nn.Module, depth: int
) -> list[torch.Tensor]:
    """The drafter's output features [B, T, H] at depths 1..``depth``, each depth reading the previous one's.

    ``hidden`` [B, T, W]: the target features depth 1 reads (W: ``config.feature_width``)."""
    length = input_ids.shape[1]
    base_positions = torch.arange(length, device=input_ids.device).expand_as(input_ids)
    outputs: list[torch.Tensor] = []
    true_k = true_v = None
    earlier_k: list[torch.Tensor] = []
    earlier_v: list[torch.Tensor] = []
    features = drafter.target_feature(hidden)
    for level in range(1, depth + 1):
        tokens = embed(shifted_tokens(input_ids, level))

        def attend(q, k, v, true_k=true_k, true_v=true_v):
            if true_k is None:  # depth 1: causal over the true pairs themselves
                return causal_plus_own_attention(q, k, v, [], [], k, v)
            return causal_plus_own_attention(q, k, v, earlier_k, earlier_v, true_k, true_v)

        step = drafter(features, tokens, base_positions + level - 1, attend)
        if true_k is None:
            true_k, true_v = step.keys, step.values
        else:
            earlier_k.append(step.keys)
            earlier_v.append(step.values)
        outputs.append(step.features)
        features = step.features
    return outputs


class DrafterObjective(nn.Module):
    """What ``accelerator.prepare`` gets for a sequential drafter: the drafter; the frozen embedding and lm_head
    beside it.

    ``forward`` returns ``(loss, vector)``: the :class:`~medusa_lite.training.losses.HeadStats`
    vector over depths (per-depth accuracy given the earlier depths right, and the chain counts).
    """

    def __init__(
        self, drafter: SequentialDrafter, base_lm_head: nn.Module, input_embeddings: nn.Module, settings: LossSettings
    ):
        super().__init__()
        self.heads = drafter  # the name the loop saves from
        self._frozen = (base_lm_head, input_embeddings)  # a tuple: not registered as submodules
        self.settings = settings

    @property
    def depth(self) -> int:
        return len(self.settings.weights)

    def forward(self, hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor, topk: int = 1):
        """``hidden`` [B, T, W]: the target states of :func:`state_layers`, side by side."""
        base_lm_head, embed = self._frozen
        drafter = self.heads
        settings = self.settings
        config = drafter.config
        layers = state_layers(config.feature_layers, settings.reads_target_ahead)
        width = states_width(layers, config.hidden_size)
        if hidden.shape[-1] != width:
            raise ValueError(
                f"the drafter's batch should hold target states of width {width} (layers {layers or 'final'}), "
                f"got {hidden.shape[-1]}"
            )
        parameter = next(drafter.parameters())
        features = hidden[..., : config.feature_width].to(parameter.dtype)
        outputs = unrolled_features(drafter, features, input_ids, embed, self.depth)
        targets = head_targets(input_ids, loss_mask, self.depth)  # [B, T, K]: depth d at t guesses x_{t+1+d}
        batch_index, position = torch.nonzero((targets != IGNORE).any(dim=-1), as_tuple=True)
        rows = torch.stack([out[batch_index, position] for out in outputs], dim=1)  # [P, K, H]
        row_targets = targets[batch_index, position]
        if drafter.draft_token_ids is not None:
            row_targets = to_draft_targets(row_targets, drafter.draft_token_ids, drafter.config.vocab_size)
        weights = torch.tensor(settings.weights)
        teacher = None
        if settings.reads_target_ahead:
            final = hidden[..., -config.hidden_size :]
            teacher = states_ahead(final, batch_index, position, self.depth)
        loss, stats = head_loss(
            rows,
            row_targets,
            lambda h: drafter.project(h, base_lm_head).float(),
            weights=weights,
            teacher_hidden=teacher,
            teacher_project=lambda h: teacher_logits(drafter, h, base_lm_head),
            distill_weight=settings.distill_weight,
            topk=topk,
            chunk_size=settings.chunk_size,
        )
        if settings.feature_weight > 0:
            normalised = drafter.output_norm(rows)
            loss = loss + settings.feature_weight * feature_regression(
                normalised, teacher, row_targets != IGNORE, weights
            )
        return loss, stats.as_vector()
