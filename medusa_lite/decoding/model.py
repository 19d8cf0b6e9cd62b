"""The target model, frozen and used as it is, together with its Medusa heads.

No modeling code is copied: any Hugging Face causal LM works as long as its attention takes a
custom 4D mask (``eager`` or ``sdpa``), which tree verification needs.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from medusa_lite.decoding.attention import TREE_SDPA
from medusa_lite.drafters.draft_vocab import DraftLMHead
from medusa_lite.drafters.medusa.config import MedusaConfig
from medusa_lite.drafters.medusa.heads import MedusaHeads
from medusa_lite.errors import (
    IncompatibleHeadsError,
    MedusaError,
    TreeError,
    UnsupportedModelError,
)
from medusa_lite.proposers.datastore import Datastore
from medusa_lite.trees.dynamic_tree import DynamicTree
from medusa_lite.trees.tree import Tree, as_tree

# Attention implementations known to apply an arbitrary additive 4D mask (tree attention).
TREE_CAPABLE_ATTENTION = ("eager", "sdpa", TREE_SDPA)


@dataclass(frozen=True)
class IndexedLayers(Sequence):
    """``layers`` each indexed by ``index`` when read: :meth:`TargetOutput.select` costs nothing for layers never read
    (a model has dozens; a proposer reads a few)."""

    layers: Sequence[torch.Tensor]
    index: object

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.layers[i][self.index]

    def __len__(self) -> int:
        return len(self.layers)


@dataclass
class TargetOutput:
    """One forward of the target: next-token logits and final (post-norm) hidden states."""

    logits: torch.Tensor  # [batch, seq, vocab]
    hidden: torch.Tensor  # [batch, seq, hidden]
    # every hidden state the forward returned (transformers' ``hidden_states``: the embeddings, then
    # each decoder layer's output, the last one post-norm, so ``layers[-1]`` is ``hidden``)
    layers: Sequence[torch.Tensor] = ()

    def select(self, index) -> TargetOutput:
        """The same output indexed alike in logits, hidden and every layer (e.g. ``0``: the first sequence)."""
        return TargetOutput(self.logits[index], self.hidden[index], IndexedLayers(self.layers, index))


def text_config(base_model: PreTrainedModel):
    config = base_model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def hidden_state_count(base_model: PreTrainedModel) -> int:
    """How many hidden states a forward returns: the embeddings, then each decoder layer's output."""
    return text_config(base_model).num_hidden_layers + 1


@functools.cache
def cache_keyword(model_class: type) -> str:
    """The keyword a model's ``forward`` takes its KV cache by.

    transformers renamed ``past_key_values`` to ``cache`` (5.24 takes both, warning on the old
    name; 5.17 knows only the old one and silently ignores ``cache``, building a cache of its own).
    """
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def base_model_name(base_model: PreTrainedModel) -> str | None:
    return getattr(base_model.config, "_name_or_path", None) or getattr(base_model, "name_or_path", None) or None


def check_heads_fit(base_model: PreTrainedModel, config: MedusaConfig) -> None:
    """Raise if the heads' sizes differ from the model's; warn if they name another model."""
    model_config = text_config(base_model)
    vocab = base_model.get_output_embeddings().weight.shape[0]
    if config.hidden_size != model_config.hidden_size:
        raise IncompatibleHeadsError(
            f"Medusa heads expect hidden size {config.hidden_size} but the model has hidden size "
            f"{model_config.hidden_size}: these heads were trained for another model "
            f"({config.base_model_name_or_path!r})"
        )
    if config.vocab_size != vocab:
        raise IncompatibleHeadsError(
            f"Medusa heads expect vocab size {config.vocab_size} but the model's lm_head has {vocab} outputs: "
            f"these heads were trained for another model ({config.base_model_name_or_path!r})"
        )
    name = base_model_name(base_model)
    if config.base_model_name_or_path and name and config.base_model_name_or_path != name:
        warnings.warn(
            f"Medusa heads were trained for {config.base_model_name_or_path!r} but are attached to {name!r}. "
            "Sizes match, so decoding stays exact (the target verifies every token), but guesses may be poor.",
            stacklevel=3,
        )


def check_tree_attention_supported(base_model: PreTrainedModel) -> None:
    implementation = getattr(base_model.config, "_attn_implementation", None) or "eager"
    if implementation not in TREE_CAPABLE_ATTENTION:
        raise UnsupportedModelError(
            f"attention implementation {implementation!r} cannot take the custom 4D tree attention mask; "
            f"load the model with attn_implementation={TREE_SDPA!r} (registered by importing medusa_lite), "
            "'sdpa' or 'eager'"
        )


class MedusaModel(nn.Module):
    """A frozen causal LM plus K Medusa heads reading its last hidden state (or no heads: ``heads=None``).

    Like a generation config, the model carries what ``generate`` uses when given nothing else:
    ``proposers``, the sources of guesses (:mod:`medusa_lite.proposers.base`; default: the lookups,
    then the heads on ``tree``), ``tree``, the heads' candidate tree (by default the one the heads'
    training summary suggests; the root alone without heads), and ``datastore`` (read-only), where
    the datastore lookup finds guesses the text itself has no match for. The model holds no
    decoding state: the KV cache and everything else of a generation live in :func:`medusa_lite.generate`.

    Heads with a draft vocabulary project through ``draft_lm_head``, the base lm_head's rows of
    the draft ids gathered once here (derived data: non-persistent, never saved); after changing
    the base lm_head or the heads' ids in place, call :meth:`refresh_draft_lm_head`.
    """

    def __init__(
        self,
        base_model: PreTrainedModel,
        heads: MedusaHeads | None = None,
        *,
        tree=None,
        datastore: Datastore | None = None,
        proposers=None,
        freeze_base: bool = True,
    ):
        super().__init__()
        if heads is not None:
            check_heads_fit(base_model, heads.config)
        self.base_model = base_model
        self.heads = heads
        num_heads = self.num_heads
        if heads is None and tree is None:
            resolved = Tree(())  # no heads: the root alone
        else:
            resolved = as_tree(tree, num_heads, heads.config.training_summary if heads is not None else None)
        self.tree: Tree | DynamicTree = resolved.pruned(num_heads)  # a dynamic tree guesses only as deep as the heads
        if datastore is not None:
            datastore.check_fits(self.vocab_size)
        self.datastore: Datastore | None = datastore
        self.proposers = proposers  # what generate uses when given none (None: the default set); checked there
        if freeze_base:
            base_model.requires_grad_(False)
        parameter = base_model.get_output_embeddings().weight
        tensors = (
            [*heads.parameters(), *heads.buffers()] if heads is not None else []
        )  # buffers: the draft ids must sit on the model's device too
        if any(
            t.device != parameter.device or (t.is_floating_point() and t.dtype != parameter.dtype) for t in tensors
        ):
            heads.to(device=parameter.device, dtype=parameter.dtype)
        self.draft_lm_head: DraftLMHead | None = None
        self.refresh_draft_lm_head()

    @classmethod
    def with_new_heads(
        cls,
        base_model: PreTrainedModel,
        num_heads: int,
        *,
        num_layers: int = 1,
        use_base_lm_head: bool = True,
        draft_token_ids: torch.Tensor | None = None,
        next_token_input: bool = False,
    ) -> MedusaModel:
        """Attach freshly initialised heads sized for ``base_model``; ``draft_token_ids``: guess among these tokens
        only.
        """
        config = MedusaConfig(
            num_heads=num_heads,
            hidden_size=text_config(base_model).hidden_size,
            vocab_size=base_model.get_output_embeddings().weight.shape[0],
            num_layers=num_layers,
            use_base_lm_head=use_base_lm_head,
            draft_vocab_size=None if draft_token_ids is None else int(torch.as_tensor(draft_token_ids).numel()),
            next_token_input=next_token_input,
            base_model_name_or_path=base_model_name(base_model),
        )
        heads = MedusaHeads(config)
        heads.init_lm_heads_from(base_model.get_output_embeddings())
        if draft_token_ids is not None:
            heads.set_draft_vocab(draft_token_ids)
        return cls(base_model, heads)

    def refresh_draft_lm_head(self) -> None:
        """(Re)gather the base lm_head rows of the heads' draft vocabulary (no-op without one)."""
        ids = self.heads.draft_token_ids if self.heads is not None else None
        self.draft_lm_head = None if ids is None else DraftLMHead(self.base_model.get_output_embeddings(), ids)

    @property
    def config(self) -> MedusaConfig | None:
        """The heads' config (None for a model without heads)."""
        return self.heads.config if self.heads is not None else None

    @property
    def num_heads(self) -> int:
        return self.heads.config.num_heads if self.heads is not None else 0

    @property
    def vocab_size(self) -> int:
        """The target's vocabulary size (its lm_head's outputs): every token id lies in [0, vocab_size)."""
        return self.base_model.get_output_embeddings().weight.shape[0]

    @property
    def guess_vocab_size(self) -> int:
        """How many distinct tokens the heads can guess (the draft vocabulary's size, else the vocabulary's):
        the most guesses per head a tree may ask for."""
        return self.heads.config.guess_vocab_size if self.heads is not None else self.vocab_size

    @property
    def device(self) -> torch.device:
        return self.base_model.get_output_embeddings().weight.device

    def target_forward(self, input_ids: torch.Tensor, **kwargs) -> TargetOutput:
        """One forward of the target; ``kwargs`` go to the model (positions, mask, ``cache``...).

        ``cache`` is passed under the name this transformers version reads (:func:`cache_keyword`).
        """
        if "cache" in kwargs:
            kwargs[cache_keyword(type(self.base_model))] = kwargs.pop("cache")
        out = self.base_model(input_ids=input_ids, output_hidden_states=True, **kwargs)
        return TargetOutput(logits=out.logits, hidden=out.hidden_states[-1], layers=tuple(out.hidden_states))

    @property
    def reads_next_token(self) -> bool:
        """Whether the heads also read the token after the hidden state (``config.next_token_input``)."""
        return self.heads is not None and self.heads.config.next_token_input

    def next_token_embeds(self, next_tokens: torch.Tensor | None) -> torch.Tensor | None:
        """The base model's input embeddings of ``next_tokens`` for heads that read them, else None."""
        if not self.reads_next_token:
            return None
        if next_tokens is None:
            raise ValueError(
                "these heads read the token after each hidden state (config.next_token_input): pass next_tokens"
            )
        return self.base_model.get_input_embeddings()(next_tokens)

    def head_logits(
        self, hidden: torch.Tensor, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states [..., H] -> the first ``num_heads`` (default all) heads' logits [..., k, G].

        ``next_tokens`` [...]: the token following each hidden state (at decoding time the tree's
        root), read only by heads with ``config.next_token_input`` (required for them).

        G = :attr:`guess_vocab_size`: logits over the full vocabulary (V), or with a draft
        vocabulary over its D tokens only, logit i being token ``heads.draft_token_ids[i]``
        (:meth:`head_topk` maps them back to token ids).
        """
        if self.heads is None:
            raise MedusaError("this MedusaModel has no heads (a target with proposers only): it has no head logits")
        output_layer = (
            self.draft_lm_head if self.draft_lm_head is not None else self.base_model.get_output_embeddings()
        )
        return self.heads.project(self.heads(hidden, num_heads, self.next_token_embeds(next_tokens)), output_layer)

    def head_topk(
        self, hidden: torch.Tensor, k: int, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Final hidden states [..., H] -> each head's ``k`` likeliest token ids [..., heads, k], best first.

        Always full-vocabulary token ids, with or without a draft vocabulary. ``next_tokens``: as
        in :meth:`head_logits`.
        """
        return self.ranked_guesses(self.head_logits(hidden, num_heads, next_tokens), k)[0]

    def head_topk_probabilities(
        self, hidden: torch.Tensor, k: int, num_heads: int | None = None, next_tokens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`head_topk`, with each guess's probability under its head's softmax (same shape)."""
        logits = self.head_logits(hidden, num_heads, next_tokens)
        token_ids, top_logits = self.ranked_guesses(logits, k)
        return token_ids, (top_logits - torch.logsumexp(logits, dim=-1, keepdim=True)).exp()

    def ranked_guesses(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Head logits [..., G] -> (the ``k`` likeliest full-vocabulary token ids, their logits), best first."""
        if k > self.guess_vocab_size:
            among = "their draft vocabulary" if self.heads.draft_token_ids is not None else "the vocabulary"
            raise TreeError(
                f"asked for each head's top-{k} guesses but the heads guess among only "
                f"{self.guess_vocab_size} tokens ({among})"
            )
        ranked = logits.topk(k, dim=-1)
        return self.heads.guess_ids(ranked.indices), ranked.values

    def generate(
        self,
        inputs=None,
        generation_config=None,
        logits_processor=None,
        stopping_criteria=None,
        streamer=None,
        **kwargs,
    ):
        """``model.generate``'s call and return value, decoded with exact speculative decoding.

        Takes what ``base_model.generate`` takes (a ``GenerationConfig``, keyword options, ``**inputs``)
        and returns what it returns (the sequences, or a ``GenerateDecoderOnlyOutput`` with
        ``return_dict_in_generate=True``); options it cannot apply exactly are refused by name
        (:mod:`medusa_lite.decoding.drop_in`).
        """
        from medusa_lite.decoding.drop_in import (
            generate_like_transformers,
        )  # the loop reads this model: imported when called

        return generate_like_transformers(
            self, inputs, generation_config, logits_processor, stopping_criteria, streamer, **kwargs
        )

    def forward(self, input_ids: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Base logits [B, T, V] and head logits [B, T, K, G] from one forward (G: see :meth:`head_logits`).

        Heads that read the next token get ``input_ids`` shifted by one (the last position, which
        has no next token in ``input_ids``, gets the base model's greedy pick).
        """
        out = self.target_forward(input_ids, **kwargs)
        next_tokens = None
        if self.reads_next_token:
            next_tokens = torch.cat([input_ids[:, 1:], out.logits[:, -1:].argmax(dim=-1)], dim=1)
        return out.logits, self.head_logits(out.hidden, next_tokens=next_tokens)
