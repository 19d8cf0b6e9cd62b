"""Draft-model speculative decoding as a proposer: a small causal LM guesses, the target verifies.

Classic speculative sampling (Leviathan et al. 2023; Chen et al. 2023; transformers' assisted
generation): a draft model sharing the target's tokenizer drafts k tokens one forward at a time,
the target verifies them in one forward, and each drafted token x ~ q is accepted with
min(1, p(x)/q(x)), the residual norm(max(p - q, 0)) giving the token after the first rejection
(:mod:`medusa_lite.decoding.acceptance`). Greedy: the draft's argmax chain, accepted while it equals the
target's argmax, so the output is the target's own greedy output.

A draft TREE (``branching``, children per node by depth, SpecInfer / EAGLE style) samples several
children per node without replacement (each records the q it was drawn from: the draft's
distribution with the earlier siblings removed) and drafts a whole level in one forward of the
draft model under a tree attention mask.

The draft model keeps its own KV cache across steps: after each verification it is cut back to
the committed tokens it holds (for a chain, the accepted prefix of its own draft stays), and the
next step feeds only the tokens it has not seen, never the whole prefix again. Chain length k
adapts like transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a step that
accepted every drafted token, -1 (down to 1) otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Cache, PreTrainedModel

from medusa_lite.decoding.architectures import model_class_for, tree_attention_implementation
from medusa_lite.decoding.cache import ReservedLayer
from medusa_lite.decoding.model import cache_keyword, check_tree_attention_supported, text_config
from medusa_lite.decoding.sampling import logits_to_probs
from medusa_lite.errors import MedusaError
from medusa_lite.proposers.base import Candidates, Proposer, StepContext, StepLimits, StepOutcome

DRAFT_MODEL_SOURCE = "draft_model"
# transformers' assisted generation starts at 20 drafted tokens for GPUs; on a CPU every verified
# row costs, so a short chain to start, grown by the heuristic while it is accepted whole.
DEFAULT_DRAFT_TOKENS = 4
DEFAULT_MAX_DRAFT_TOKENS = 10
# The heuristic schedule (transformers' AssistedCandidateGenerator): grow after a fully accepted draft, else shrink.
GROW_AFTER_FULL_ACCEPTANCE = 2
SHRINK_AFTER_REJECTION = 1


class DraftModelError(MedusaError, ValueError):
    """A draft model that cannot draft for this target (another vocabulary or tokenizer), or bad draft settings."""


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def output_vocab_size(model: PreTrainedModel) -> int:
    return model.get_output_embeddings().weight.shape[0]


def check_same_tokenizer(draft_tokenizer, target_tokenizer) -> None:
    """Raise :class:`DraftModelError` unless both tokenizers map the same strings to the same ids."""
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise DraftModelError(
            "the draft model's tokenizer differs from the target's (their vocabularies map tokens to different ids): "
            "a draft model must share the target's tokenizer"
        )


def truncate_cache(cache: Cache, length: int) -> None:
    """Keep the first ``length`` positions of every layer (views: nothing is copied)."""
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel():
            layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


def sample_without_replacement(q: torch.Tensor, count: int, generator) -> tuple[list[int], list[torch.Tensor]]:
    """``count`` distinct tokens drawn one by one from ``q`` [V], each with the q it was drawn from.

    Each drawn token is removed from q (and q renormalised) before the next draw.
    """
    tokens, drawn_from = [], []
    for _ in range(min(count, int((q > 0).sum()))):
        token = int(torch.multinomial(q, 1, generator=generator))
        tokens.append(token)
        drawn_from.append(q)
        q = q.clone()
        q[token] = 0.0
        q = q / q.sum()
    return tokens, drawn_from


class DraftModelProposer(Proposer):
    """Guesses from ``draft_model``, any Hugging Face causal LM with the target's tokenizer.

    ``k``: tokens drafted per step at first (a chain), adapted between 1 and ``max_k`` when
    ``adaptive``. ``branching``: draft a tree instead, ``branching[d]`` children per node at depth
    d + 1 (e.g. (2, 2, 1): 2 + 4 + 4 nodes), fixed. ``tokenizer`` / ``target_tokenizer``: when both
    are given, they must agree (checked here).
    """

    name: ClassVar[str] = DRAFT_MODEL_SOURCE

    def __init__(
        self,
        draft_model: PreTrainedModel,
        *,
        k: int = DEFAULT_DRAFT_TOKENS,
        max_k: int = DEFAULT_MAX_DRAFT_TOKENS,
        adaptive: bool = True,
        branching: Sequence[int] | None = None,
        tokenizer=None,
        target_tokenizer=None,
    ):
        if not isinstance(draft_model, PreTrainedModel) or draft_model.get_output_embeddings() is None:
            raise DraftModelError(
                "draft_model must be a Hugging Face causal LM (a PreTrainedModel with an lm_head), "
                f"got {type(draft_model).__name__}"
            )
        if not is_count(k):
            raise DraftModelError(f"k (tokens drafted per step) must be an integer >= 1, got {k!r}")
        if not is_count(max_k) or max_k < k:
            raise DraftModelError(f"max_k must be an integer >= k ({k}), got {max_k!r}")
        if branching is not None:
            branching = tuple(branching)
            if not branching or not all(is_count(width) for width in branching):
                raise DraftModelError(
                    f"branching must be a non-empty list of children per node (integers >= 1), got {list(branching)!r}"
                )
            check_tree_attention_supported(draft_model)
        if tokenizer is not None and target_tokenizer is not None:
            check_same_tokenizer(tokenizer, target_tokenizer)
        self.draft_model, self.k, self.max_k, self.adaptive, self.branching = (
            draft_model,
            k,
            max_k,
            adaptive,
            branching,
        )

    def max_nodes(self, limits: StepLimits) -> int:
        widths = self.branching if self.branching is not None else (1,) * self.max_k
        if limits.max_depth is not None:
            widths = widths[: max(limits.max_depth, 0)]
        total, level = 0, 1
        for width in widths:
            level *= width
            total += level
        return total

    def begin(self, model, prompt: torch.Tensor, limits: StepLimits) -> RunningDraftModel:
        vocab, target_vocab = output_vocab_size(self.draft_model), model.vocab_size
        if vocab != target_vocab:
            raise DraftModelError(
                f"the draft model's vocabulary has {vocab} tokens, the target's {target_vocab}: "
                "a draft model must share the target's tokenizer"
            )
        capacity = prompt.numel() + (limits.max_depth or 0) + 1 + self.max_nodes(limits)
        return RunningDraftModel(self, capacity)


class RunningDraftModel(Proposer):
    """A :class:`DraftModelProposer` during one generation: its KV cache, what it holds, the current k."""

    name: ClassVar[str] = DRAFT_MODEL_SOURCE

    def __init__(self, spec: DraftModelProposer, capacity: int):
        self.spec, self.k = spec, spec.k
        model = spec.draft_model
        self.cache = Cache(layers=[ReservedLayer(capacity) for _ in range(text_config(model).num_hidden_layers)])
        self.cached = 0  # committed tokens held by the cache (the positions after them are this step's draft)
        self.drafted: list[int] = []  # this step's chain (to keep its accepted prefix)
        self.device = model.get_output_embeddings().weight.device

    def max_nodes(self, limits):
        return self.spec.max_nodes(limits)

    def forward(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """Logits [n, V] of the draft model over ``input_ids`` [n], appended to its cache."""
        model = self.spec.draft_model
        kwargs[cache_keyword(type(model))] = self.cache
        return model(input_ids=input_ids.to(self.device)[None], use_cache=True, **kwargs).logits[0].float()

    def catch_up(self, history: torch.Tensor) -> torch.Tensor:
        """Feed the committed tokens the cache lacks; the draft's logits [V] for the token after ``history``."""
        logits = self.forward(history[self.cached :])[-1]
        self.cached = history.numel()
        return logits

    def propose(self, step: StepContext) -> Candidates | None:
        if self.spec.branching is not None:
            return self.propose_tree(step)
        count = min(self.k, step.max_depth, step.max_nodes)
        if count < 1:
            return None
        logits = self.catch_up(step.history)
        tokens, qs = [], []
        for index in range(count):
            if step.settings.greedy:
                token, q = int(logits.argmax()), None
            else:
                q = logits_to_probs(logits, step.settings)
                token = int(torch.multinomial(q, 1, generator=step.generator))
            tokens.append(token)
            qs.append(q)
            if index + 1 < count:
                logits = self.forward(torch.tensor([token]))[-1]
        self.drafted = tokens
        return Candidates.chain(torch.tensor(tokens, device=step.root.device), None if step.settings.greedy else qs)

    def propose_tree(self, step: StepContext) -> Candidates | None:
        widths = self.spec.branching[: max(step.max_depth, 0)]
        if not widths:
            return None
        level = [(0, self.catch_up(step.history))]  # (node, the draft's logits after it)
        tokens: list[int] = []
        parents: list[int] = []
        qs: list[torch.Tensor | None] = []
        ancestors: list[list[int]] = [[]]  # per node (0 = root): its tree ancestors and itself, nodes >= 1
        for depth, width in enumerate(widths, start=1):
            first = len(tokens) + 1
            for parent, logits in level:
                if step.settings.greedy:
                    children, drawn_from = logits.topk(width).indices.tolist(), [None] * width
                else:
                    children, drawn_from = sample_without_replacement(
                        logits_to_probs(logits, step.settings), width, step.generator
                    )
                for token, q in zip(children, drawn_from):
                    tokens.append(token)
                    parents.append(parent)
                    qs.append(q)
                    ancestors.append(ancestors[parent] + [len(tokens)])
            new = list(range(first, len(tokens) + 1))
            if depth == len(widths):
                break
            logits = self.forward_level(step, new, tokens, ancestors, depth)
            level = list(zip(new, logits))
        self.drafted = []
        return Candidates(torch.tensor(tokens, device=step.root.device), parents, None if step.settings.greedy else qs)

    def forward_level(
        self, step: StepContext, new: list[int], tokens: list[int], ancestors: list[list[int]], depth: int
    ) -> torch.Tensor:
        """The draft's logits [len(new), V] after the tree nodes ``new`` (all at ``depth``): one forward, tree mask."""
        fed = self.cache.get_seq_length() - self.cached  # tree nodes already in the cache: nodes 1..fed, in order
        allowed = torch.zeros(len(new), self.cached + fed + len(new), dtype=torch.bool)
        allowed[:, : self.cached] = True  # every committed token
        for row, node in enumerate(new):
            allowed[row, [self.cached + ancestor - 1 for ancestor in ancestors[node]]] = (
                True  # its ancestors and itself
            )
        dtype = self.spec.draft_model.dtype
        mask = (
            torch.zeros(allowed.shape, dtype=dtype)
            .masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]
            .to(self.device)
        )
        positions = torch.full((1, len(new)), self.cached - 1 + depth, device=self.device)
        return self.forward(
            torch.tensor([tokens[node - 1] for node in new]), attention_mask=mask, position_ids=positions
        )

    def accepted(self, outcome: StepOutcome) -> None:
        guesses = outcome.tokens[:-1].tolist()
        # The accepted prefix of this step's chain keeps its cache entries (the last drafted token was never fed).
        kept = 0
        while kept < min(len(guesses), len(self.drafted) - 1) and guesses[kept] == self.drafted[kept]:
            kept += 1
        if self.spec.adaptive and self.spec.branching is None and self.drafted:
            full = len(guesses) >= len(self.drafted) and guesses[: len(self.drafted)] == self.drafted
            grown = self.k + GROW_AFTER_FULL_ACCEPTANCE if full else self.k - SHRINK_AFTER_REJECTION
            self.k = min(max(grown, 1), self.spec.max_k)
        self.cached += kept
        truncate_cache(self.cache, self.cached)
        self.drafted = []


def load_draft_model(path: str, model, target_tokenizer, **options) -> DraftModelProposer:
    """A :class:`DraftModelProposer` for the HF causal LM at ``path`` (folder or Hub id), in the target's dtype and
    on its device, its tokenizer checked against ``target_tokenizer``; ``options`` go to the proposer."""
    attention = tree_attention_implementation(model_class_for(AutoConfig.from_pretrained(path)))
    draft = AutoModelForCausalLM.from_pretrained(path, dtype=model.base_model.dtype, attn_implementation=attention)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return DraftModelProposer(
        draft.to(model.device).eval(), tokenizer=tokenizer, target_tokenizer=target_tokenizer, **options
    )
