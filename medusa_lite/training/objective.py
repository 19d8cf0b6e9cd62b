"""The modules handed to ``accelerator.prepare``: what trains, and the loss it minimises.

- :class:`HeadsObjective` (heads only): input is the frozen target's last hidden states, so the
  same module trains from a live forward or from the hidden-state cache. The frozen base lm_head
  is kept outside the module tree (DDP/DeepSpeed never see, partition or checkpoint it).
- :class:`Medusa2Objective`: the peft-wrapped target and the heads together; the backbone's LoRA
  trains jointly with the heads, plus a self-distillation term KL(original || adapted) on the
  next-token distribution of response tokens, where "original" is the same model with its
  adapters disabled.

Both return ``(loss, stats_vector)`` (a plain tensor, so DDP/DeepSpeed pass it through).

With a draft vocabulary (``heads.draft_token_ids``), both take full-vocabulary targets and map
them to draft indices themselves (so the live and the cached paths need no change), the heads'
logits cover the D draft tokens only, and the distillation teacher is the base distribution
restricted to the draft vocabulary and renormalised there (KL needs both sides on the same
tokens). Medusa-2's KL(original || adapted) is about the backbone and stays on the full vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from medusa_lite.drafters.draft_vocab import draft_rows
from medusa_lite.drafters.hydra.heads import HydraHeads
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.drafters.sequential.drafter import SequentialDrafter
from medusa_lite.training.losses import chunked_kl, gather_rows, head_loss, response_positions, to_draft_targets


@dataclass
class LossSettings:
    weights: list[float]
    distill_weight: float = 0.0
    chunk_size: int = 1024
    feature_weight: float = 0.0  # the sequential drafter's feature regression (training/drafter_objective.py)

    @property
    def reads_target_ahead(self) -> bool:
        """Whether a drafter's loss reads the target's final hidden states ahead (distillation, feature regression)."""
        return self.distill_weight > 0 or self.feature_weight > 0


def project_with(lm_head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Apply a (possibly bf16) frozen lm_head to float hidden states; logits in float32."""
    return lm_head(hidden.to(lm_head.weight.dtype)).float()


def heads_logits(heads: MedusaHeads | HydraHeads, head_hidden: torch.Tensor, base_lm_head: nn.Module) -> torch.Tensor:
    """Per-head hidden states [P, K, H] -> logits [P, K, G] (float32; G: D with a draft vocabulary, else V)."""
    if isinstance(heads, HydraHeads) or heads.config.use_base_lm_head:
        return heads.project(head_hidden.to(base_lm_head.weight.dtype), base_lm_head).float()
    return torch.stack(
        [head.lm_head(head_hidden[:, k].to(head.lm_head.weight.dtype)).float() for k, head in enumerate(heads.heads)],
        dim=1,
    )


def teacher_logits(
    heads: MedusaHeads | SequentialDrafter, hidden: torch.Tensor, base_lm_head: nn.Module
) -> torch.Tensor:
    """The distillation teacher's logits (float32): the base model's, over the heads' guess vocabulary.

    With a draft vocabulary only its D logits are kept, so the softmax of the KL renormalises the
    teacher over the draft tokens (the mass outside them is nothing the heads could learn).
    """
    if heads.draft_token_ids is None:
        return project_with(base_lm_head, hidden)
    return F.linear(hidden.to(base_lm_head.weight.dtype), *draft_rows(base_lm_head, heads.draft_token_ids)).float()


def guess_targets(heads: MedusaHeads | HydraHeads, targets: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary targets -> indices into the heads' logits (draft indices with a draft vocabulary)."""
    if heads.draft_token_ids is None:
        return targets
    return to_draft_targets(targets, heads.draft_token_ids, heads.config.vocab_size)


def run_heads(
    heads: MedusaHeads | HydraHeads,
    hidden: torch.Tensor,
    path_tokens: torch.Tensor | None,
    input_embeddings: nn.Module | None,
) -> torch.Tensor:
    """Per-head hidden states [P, K, H] in the heads' dtype. ``path_tokens`` [P, K] (tokens n+1 .. n+K) are embedded
    only for heads that read them: Hydra-style heads read them all (teacher forcing), Medusa heads with
    ``next_token_input`` the first.
    """
    parameter = next(heads.parameters())
    if isinstance(heads, HydraHeads):
        return heads(hidden.to(parameter.dtype), input_embeddings(path_tokens).to(parameter.dtype))
    embeds = input_embeddings(path_tokens[:, 0]).to(parameter.dtype) if heads.config.next_token_input else None
    return heads(hidden.to(parameter.dtype), next_token_embeds=embeds)


class HeadsObjective(nn.Module):
    def __init__(
        self,
        heads: MedusaHeads | HydraHeads,
        base_lm_head: nn.Module,
        settings: LossSettings,
        input_embeddings: nn.Module | None = None,
    ):
        """``input_embeddings``: the base model's, needed by Hydra-style heads and heads with
        ``config.next_token_input``."""
        super().__init__()
        reads_tokens = isinstance(heads, HydraHeads) or heads.config.next_token_input
        if reads_tokens and input_embeddings is None:
            raise ValueError("heads that read drafted tokens need the base model's input embeddings")
        self.heads = heads
        self._frozen = (base_lm_head, input_embeddings)  # a tuple: not registered as submodules
        self.settings = settings

    @property
    def base_lm_head(self) -> nn.Module:
        return self._frozen[0]

    @property
    def input_embeddings(self) -> nn.Module | None:
        return self._frozen[1]

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        teacher_hidden: torch.Tensor | None = None,
        path_tokens: torch.Tensor | None = None,
        topk: int = 1,
    ):
        """``topk``: ranks counted in the stats (1 while training, the configured k when evaluating).

        ``path_tokens`` [P, K]: tokens n+1 .. n+K of each row (see :func:`run_heads`).
        """
        s = self.settings
        loss, stats = head_loss(
            run_heads(self.heads, hidden, path_tokens, self.input_embeddings),
            guess_targets(self.heads, targets),
            lambda h: heads_logits(self.heads, h, self.base_lm_head),
            weights=torch.tensor(s.weights),
            teacher_hidden=teacher_hidden,
            teacher_project=lambda h: teacher_logits(self.heads, h, self.base_lm_head),
            distill_weight=s.distill_weight,
            topk=topk,
            chunk_size=s.chunk_size,
        )
        return loss, stats.as_vector()


def body_of(causal_lm: nn.Module) -> nn.Module:
    """The decoder stack (embeddings + layers + final norm) of a causal LM or a peft wrapper of one."""
    model = causal_lm.get_base_model() if hasattr(causal_lm, "get_base_model") else causal_lm
    return model.get_decoder()


def last_hidden(causal_lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Final (post-norm) hidden states [B, T, H]: what the lm_head and the heads read."""
    return body_of(causal_lm)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


def hidden_layers(
    causal_lm: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers: list[int] | None
) -> torch.Tensor:
    """The hidden states at ``layers`` (indices into the body's ``hidden_states``, -1: the final, post-norm one)
    side by side [B, T, H x len(layers)]; None: the final ones alone (:func:`last_hidden`)."""
    if layers is None:
        return last_hidden(causal_lm, input_ids, attention_mask)
    out = body_of(causal_lm)(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False, output_hidden_states=True
    )
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1)


class Medusa2Objective(nn.Module):
    def __init__(self, peft_model: nn.Module, heads: MedusaHeads, settings: LossSettings, base_distill_weight: float):
        super().__init__()
        self.model = peft_model
        self.heads = heads
        self.settings = settings
        self.base_distill_weight = base_distill_weight

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_base_model().get_output_embeddings()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, topk: int = 1):
        s = self.settings
        num_heads = self.heads.config.num_heads
        hidden = last_hidden(self.model, input_ids, attention_mask)
        with torch.no_grad(), self.model.disable_adapter():
            original = last_hidden(self.model, input_ids, attention_mask)
        rows = gather_rows(
            hidden, input_ids, loss_mask, num_heads, with_teacher=s.distill_weight > 0, teacher_source=original
        )
        loss, stats = head_loss(
            run_heads(self.heads, rows.hidden.float(), rows.path_tokens, self.model.get_input_embeddings()),
            guess_targets(self.heads, rows.targets),
            lambda h: heads_logits(self.heads, h, self.lm_head),
            weights=torch.tensor(s.weights),
            teacher_hidden=rows.teacher_hidden,
            teacher_project=lambda h: teacher_logits(self.heads, h, self.lm_head),
            distill_weight=s.distill_weight,
            topk=topk,
            chunk_size=s.chunk_size,
        )
        batch_index, position = response_positions(loss_mask)
        base_kl = chunked_kl(
            hidden[batch_index, position],
            original[batch_index, position],
            lambda h: project_with(self.lm_head, h),
            s.chunk_size,
        )
        return loss + self.base_distill_weight * base_kl, torch.cat(
            [stats.as_vector(), base_kl.detach().double()[None]]
        )
