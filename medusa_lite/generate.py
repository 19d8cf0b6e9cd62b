"""The decoding loop: propose -> verify -> accept -> commit.

Each step the heads propose a tree of guesses from the last accepted hidden state, the target
verifies the whole tree in one forward, the longest path the target agrees with is accepted
(plus one bonus token drawn from the target), and the KV cache keeps only that path.

Why it is exact: at every tree node the target's own next token is drawn (argmax, or a sample
from the temperature/top-k/top-p distribution), independently per node. Walking down from the
root, we move to the child whose guess equals the target's token at the current node, and stop
at the first node where no child matches; the target's token there is the bonus. Every emitted
token is therefore the target's own draw given exactly the tokens before it, so the output has
the target's distribution (greedy: the target's tokens). This is the "sample t ~ p and descend
if t is a child" form of the exact rule for deterministic candidates (../shared/DESIGN.md §1), and it
accepts as often as the try-children-in-order form.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from medusa_lite.cache import reserved_cache
from medusa_lite.datastore import Datastore, datastore_continuation
from medusa_lite.dynamic_tree import DynamicTree, SpeculationGate, chain_ranks
from medusa_lite.inputs import (
    as_datastore,
    as_prompt,
    check_context,
    check_generator,
    check_lookup_tokens,
    check_max_new_tokens,
    check_streamer,
    check_token_ids,
    checked_model_in_eval_mode,
    context_limit,
    eos_ids,
)
from medusa_lite.lookup import LOOKUP_TOKENS_PER_MATCHED_TOKEN, DraftTree, copy_after_match, draft_tree, graft_chain, latest_match
from medusa_lite.model import MedusaModel, TargetOutput, check_tree_attention_supported
from medusa_lite.sampling import SamplingSettings, pick_tokens
from medusa_lite.tree import Tree, as_tree, check_topk_fits
from medusa_lite.verify import keep_accepted_in_cache, verify_tree

# Most prompt-lookup guesses grafted onto the tree per step (see medusa_lite.lookup); 0 = heads only.
# A match of n tokens gets at most 2n of them (LOOKUP_TOKENS_PER_MATCHED_TOKEN). History: a flat
# 3-token chain while verifying 4+ rows cost ~1.5x a one-token step (MKL); with the row_gemm kernel
# up to 8 rows cost ~1.2-1.3x, and 6 (for 3-token matches) won the replay in medusa_lite.lookup.
DEFAULT_LOOKUP_TOKENS = 6
# Most datastore guesses per step (medusa_lite.datastore), used when the text itself has no match
# of TRUSTED_MATCH_TOKENS tokens; 0 = no datastore. Replay (benchmarks/lookup_policy/, 120 held-out
# self-distilled prompts): 3/4/5 tokens predict 1.889/1.908/1.894x.
DEFAULT_DATASTORE_TOKENS = 4
# A prompt-lookup match this long is preferred to the datastore (replay: 2 tokens 1.908x, 1 1.893x, 3 1.888x).
TRUSTED_MATCH_TOKENS = 2
NO_CHAIN = torch.zeros(0, dtype=torch.long)
ROOT_ONLY = Tree(())  # a plain step's draft: the root alone


@dataclass
class GenerationStats:
    """What happened during one ``generate`` call.

    Convention: ``mean_accepted_tokens`` = new tokens / calls of the target, the prefill
    included, so plain decoding scores exactly 1.00 and the bonus token is counted.
    ``mean_tokens_per_step`` leaves the prefill and its token out: tokens per verification step,
    what Spec-Bench and the Medusa/EAGLE papers report as "mean accepted tokens".
    """

    tree_nodes: int
    tree_depth: int
    new_tokens: int = 0
    target_calls: int = 0
    tokens_per_step: list[int] = field(default_factory=list)  # per verification step, bonus included
    accepted_at_depth: list[int] = field(default_factory=list)  # [d-1]: steps that accepted a guess at depth d
    lookup_steps: int = 0  # steps whose accepted path used a guess only a lookup (prompt or datastore) made
    datastore_steps: int = 0  # of those, steps whose lookup chain came from the datastore
    verified_rows: int = 0  # tree + lookup rows verified, summed over steps
    plain_steps: int = 0  # steps taken without guesses because speculation was not paying (SpeculationGate)

    @property
    def steps(self) -> int:
        """Verification steps (target calls after the prefill)."""
        return len(self.tokens_per_step)

    @property
    def mean_accepted_tokens(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_tokens_per_step(self) -> float:
        return sum(self.tokens_per_step) / self.steps if self.steps else 0.0

    @property
    def mean_verified_rows(self) -> float:
        """Rows (tree nodes + lookup guesses, the root included) the target verified per step."""
        return self.verified_rows / self.steps if self.steps else 0.0

    @property
    def acceptance_rate_by_depth(self) -> list[float]:
        return [count / self.steps if self.steps else 0.0 for count in self.accepted_at_depth]

    def as_dict(self) -> dict:
        return {
            "new_tokens": self.new_tokens,
            "target_calls": self.target_calls,
            "steps": self.steps,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "mean_tokens_per_step": self.mean_tokens_per_step,
            "tokens_per_step": list(self.tokens_per_step),
            "accepted_at_depth": list(self.accepted_at_depth),
            "acceptance_rate_by_depth": self.acceptance_rate_by_depth,
            "lookup_steps": self.lookup_steps,
            "datastore_steps": self.datastore_steps,
            "verified_rows": self.verified_rows,
            "plain_steps": self.plain_steps,
            "mean_verified_rows": self.mean_verified_rows,
            "tree_nodes": self.tree_nodes,
            "tree_depth": self.tree_depth,
        }


@dataclass
class GenerationOutput:
    sequences: torch.Tensor  # [1, prompt + new tokens], like model.generate
    stats: GenerationStats


# -- propose -----------------------------------------------------------------------------------
def tree_tokens(tree: Tree, root_token: torch.Tensor, guesses: torch.Tensor) -> torch.Tensor:
    """Tree tokens [N]: the root, then at each node of depth d and rank r ``guesses[d - 1, r]`` (head d's r-th best)."""
    depths, ranks = tree.node_depths[1:].to(guesses.device), tree.node_ranks[1:].to(guesses.device)
    return torch.cat([root_token.view(1), guesses[depths - 1, ranks]])


def head_guesses(model: MedusaModel, hidden: torch.Tensor, root_token: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Tree tokens [N]: the root, then at each node of depth d head d's guess of that node's rank."""
    if tree.depth == 0:
        return root_token.view(1)
    guesses = model.head_topk(hidden, max(tree.topk_per_depth()), tree.depth, next_tokens=root_token.view(()))  # [depth, k]
    return tree_tokens(tree, root_token, guesses)


def dynamic_step_tree(model: MedusaModel, hidden: torch.Tensor, root_token: torch.Tensor, policy: DynamicTree, chain: torch.Tensor) -> tuple[Tree, torch.Tensor]:
    """(this step's tree, its tokens [N]): the policy's choice from the heads' confidence in their guesses."""
    depth = min(policy.depth, model.num_heads)
    if depth == 0 or policy.max_nodes == 1:
        return policy.choose([]), root_token.view(1)
    ranks = min(policy.max_nodes - 1, model.guess_vocab_size)  # all nodes may be siblings
    guesses, probabilities = model.head_topk_probabilities(hidden, ranks, depth, next_tokens=root_token.view(()))  # [depth, k]
    tree = policy.choose(probabilities.tolist(), chain_ranks(guesses, chain), chain.numel())
    return tree, tree_tokens(tree, root_token, guesses)


def propose(model: MedusaModel, hidden: torch.Tensor, root_token: torch.Tensor, tree: Tree | DynamicTree, lookup_chain: torch.Tensor | None = None) -> DraftTree:
    """This step's candidates: the heads' guesses on ``tree`` (or the tree a dynamic policy picks), plus a lookup chain grafted from the root."""
    chain = lookup_chain if lookup_chain is not None else NO_CHAIN
    if isinstance(tree, DynamicTree):
        tree, tokens = dynamic_step_tree(model, hidden, root_token, tree, chain)
    else:
        tokens = head_guesses(model, hidden, root_token, tree)
    draft = draft_tree(tree, tokens)
    return graft_chain(draft, chain) if chain.numel() else draft


def lookup_chain(history: torch.Tensor, lookup_tokens: int, datastore: Datastore | None, datastore_tokens: int) -> tuple[torch.Tensor, bool]:
    """(guesses for the tokens after the root, whether they came from the datastore).

    The text's own latest n-gram match (prompt lookup, at most 2 guesses per matched token) when it
    has one of ``TRUSTED_MATCH_TOKENS`` tokens or more (and prompt lookup is on); otherwise the datastore's continuation,
    when it has one; otherwise the shorter prompt-lookup match, if any.
    """
    n, follow = latest_match(history)
    if (lookup_tokens <= 0 or n < TRUSTED_MATCH_TOKENS) and datastore is not None and datastore_tokens > 0:
        stored = datastore_continuation(datastore, history, datastore_tokens)
        if stored.numel():
            return stored, True
    return copy_after_match(history, n, follow, lookup_tokens, LOOKUP_TOKENS_PER_MATCHED_TOKEN), False


def verify_draft(model: MedusaModel, cache, draft: DraftTree) -> TargetOutput:
    """The target's logits and hidden states at every draft node; a root-only draft takes a plain
    one-token forward (no tree mask), as cheap as a step of ``model.generate``."""
    if draft.num_nodes > 1:
        return verify_tree(model, cache, draft, draft.tokens)
    out = model.target_forward(draft.tokens[None], cache=cache, use_cache=True)
    return TargetOutput(logits=out.logits[0], hidden=out.hidden[0])


# -- accept ------------------------------------------------------------------------------------
def accepted_path(tree: Tree, candidates: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """Node indices root..deepest of the longest path whose every guess equals the target's token.

    Node j's guess is right when it equals the target's token at its parent; a node is accepted
    when it and all its ancestors are right. Siblings hold distinct guesses, so the accepted
    nodes form one chain; node indices grow with depth, so sorting them orders the chain.
    """
    parents = tree.parents.to(candidates.device)
    right = candidates == target_tokens[parents]
    right[0] = True
    ancestors = tree.ancestor_mask.to(candidates.device)
    accepted = ~(ancestors & ~right[None, :]).any(dim=-1)
    deepest = int(torch.argmax(torch.where(accepted, tree.node_depths.to(candidates.device), -1)))
    return torch.nonzero(ancestors[deepest]).squeeze(-1)


def cut_at_eos(tokens: torch.Tensor, eos: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Tokens up to and including the first EOS, and whether one was found."""
    if eos.numel() == 0:
        return tokens, False
    hits = torch.nonzero(torch.isin(tokens, eos)).flatten()
    if hits.numel() == 0:
        return tokens, False
    return tokens[: int(hits[0]) + 1], True


def record_step(stats: GenerationStats, accepted_guesses: int, used_lookup: bool, from_datastore: bool, verified_rows: int) -> None:
    """Count one verification step (lookup chains may reach deeper than the heads' tree)."""
    stats.accepted_at_depth.extend([0] * (accepted_guesses - len(stats.accepted_at_depth)))
    for depth in range(accepted_guesses):
        stats.accepted_at_depth[depth] += 1
    stats.tokens_per_step.append(accepted_guesses + 1)
    stats.lookup_steps += used_lookup
    stats.datastore_steps += used_lookup and from_datastore
    stats.verified_rows += verified_rows


# -- the loop ----------------------------------------------------------------------------------
@torch.inference_mode()
@checked_model_in_eval_mode
def generate(
    model: MedusaModel,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    tree: Tree | DynamicTree | Iterable[Sequence[int]] | None = None,
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS,
    datastore: Datastore | None | bool = True,
    datastore_tokens: int = DEFAULT_DATASTORE_TOKENS,
    eos_token_id: int | Sequence[int] | None = None,
    streamer=None,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids`` with exact Medusa decoding.

    Greedy (``temperature=0``) returns the tokens of ``model.base_model.generate(do_sample=False)``;
    with ``temperature > 0`` (and optional ``top_k`` / ``top_p``) tokens follow exactly the target's
    sampling distribution. ``tree`` is a :class:`Tree`, a list of top-k rank paths, or a
    :class:`~medusa_lite.dynamic_tree.DynamicTree` policy choosing each step's tree (default:
    ``model.tree``). ``lookup_tokens``: the most prompt-lookup guesses grafted onto the tree each
    step (copied from the prompt and the text so far, at most 2 per matched token; 0 = heads only).
    ``datastore``: where to look when the text has no 2-token match (:mod:`medusa_lite.datastore`):
    True = ``model.datastore`` (the one shipped beside the heads, if any), a :class:`Datastore`,
    or False/None for none; ``datastore_tokens``: the most guesses it adds per step (0 = none).
    ``streamer`` receives the prompt, then each step's accepted tokens (e.g.
    ``transformers.TextStreamer``). Generation stops at any of ``eos_token_id`` (default: the
    model's), included in the output. ``input_ids`` may be a tokenizer's output (``BatchEncoding``
    or dict; ``generate(model, **inputs)`` works too), ``attention_mask`` all ones (one sequence,
    no padding). The model is in eval mode during the call (greedy is then deterministic), its
    own mode restored after. Every argument is checked by :mod:`medusa_lite.inputs`.
    """
    settings = SamplingSettings(temperature, top_k, top_p)
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    lookup_tokens = check_lookup_tokens(lookup_tokens)
    datastore_tokens = check_lookup_tokens(datastore_tokens, "datastore_tokens")
    datastore = as_datastore(datastore, model)
    check_tree_attention_supported(model.base_model)
    prompt = as_prompt(input_ids, model.device, attention_mask)
    check_token_ids(prompt, model.config.vocab_size)
    full_tree = (as_tree(tree, model.num_heads) if tree is not None else model.tree).pruned(model.num_heads)
    if isinstance(full_tree, Tree):  # a dynamic tree uses only the ranks there are
        check_topk_fits(full_tree, model.guess_vocab_size)
    check_context(prompt.numel(), max_new_tokens, context_limit(model))
    eos = eos_ids(eos_token_id, model)
    check_generator(generator, model.device)
    check_streamer(streamer)

    stats = GenerationStats(tree_nodes=full_tree.num_nodes, tree_depth=full_tree.depth, accepted_at_depth=[0] * full_tree.depth)
    if streamer is not None:
        streamer.put(prompt[None].cpu())
    history = prompt  # prompt + committed tokens: where the lookup searches

    def commit(tokens: torch.Tensor) -> bool:
        """Append accepted tokens; True when generation is finished."""
        nonlocal history
        tokens, hit_eos = cut_at_eos(tokens, eos)
        history = torch.cat([history, tokens])
        stats.new_tokens += tokens.numel()
        if streamer is not None:
            streamer.put(tokens.cpu())
        return hit_eos or stats.new_tokens >= max_new_tokens

    finished = max_new_tokens == 0
    if not finished:
        # Room for the whole generation: the prompt, every new token and the widest step's tree.
        cache = reserved_cache(model, prompt.numel() + max_new_tokens + full_tree.num_nodes + max(lookup_tokens, datastore_tokens))
        # Only the last position's logits are needed (as in transformers' generate): the lm_head
        # over a long prompt would otherwise cost more than several decoding steps.
        prefill = model.target_forward(prompt[None], cache=cache, use_cache=True, logits_to_keep=1)
        stats.target_calls += 1
        root = pick_tokens(prefill.logits[0, -1:], settings, generator)
        hidden = prefill.hidden[0, -1]
        finished = commit(root)

    # A dynamic tree knows this machine's step costs: speculation pauses where it does not pay (SpeculationGate).
    pricing = full_tree if isinstance(full_tree, DynamicTree) else None
    gate = SpeculationGate()
    while not finished:
        # Never guess past max_new_tokens: a step commits at most depth + 1 tokens.
        room = max_new_tokens - stats.new_tokens - 1
        prefix_len = cache.get_seq_length()
        speculates = pricing is None or gate.speculates
        chain, from_datastore = NO_CHAIN, False
        if speculates:
            chain, from_datastore = lookup_chain(history, min(lookup_tokens, room), datastore, min(datastore_tokens, room))
        step_tree = full_tree.pruned(room) if speculates else ROOT_ONLY
        draft = propose(model, hidden, root, step_tree, chain)
        verified = verify_draft(model, cache, draft)
        stats.target_calls += 1
        target_tokens = pick_tokens(verified.logits, settings, generator)
        path = accepted_path(draft, draft.tokens, target_tokens)
        keep_accepted_in_cache(cache, prefix_len, path)
        root = target_tokens[path[-1:]]
        hidden = verified.hidden[path[-1]]
        record_step(stats, path.numel() - 1, bool(draft.from_lookup[path.cpu()].any()), from_datastore, draft.num_nodes)
        if pricing is not None:
            asked_heads = speculates and step_tree.depth > 0 and step_tree.max_nodes > 1
            cost = pricing.step_cost(draft.num_nodes, asked_heads)
            gate = gate.after_speculative_step(path.numel(), cost) if speculates else gate.after_plain_step()
            stats.plain_steps += not speculates
        finished = commit(torch.cat([draft.tokens[path[1:]], root]))

    sequences = history[None]
    if streamer is not None:
        streamer.end()
    return GenerationOutput(sequences=sequences, stats=stats)
