"""Datastore lookup: guesses copied from the target's own earlier answers.

Prompt lookup (:mod:`medusa_lite.proposers.lookup`) copies from the text at hand. When that finds nothing
(the last two tokens never occurred before), a model's stock phrases often still repeat *across*
answers: "Here are some", "In conclusion,", list and code scaffolding. REST (He et al. 2023,
"REST: Retrieval-Based Speculative Decoding") retrieves such continuations from a datastore of
text. Ours holds the target's own self-distilled answers, the ones its heads were trained on
(training split only), so it proposes what this model tends to write next.

Lookup: the longest n-gram ending the text (``max_ngram`` tokens down to ``min_ngram``) that
occurs in the datastore, then a continuation voted token by token among its occurrences: at each
position the most frequent next token, kept only while at least ``min_share`` of the occurrences
still in play agree with it (those that disagree drop out). The chain is grafted onto the tree
like a prompt-lookup chain, one more set of deterministic candidates the target verifies, so
decoding stays exact whatever the datastore holds.

The file (``datastore.safetensors`` beside the heads) holds only the token ids, documents
separated by -1; the n-gram index is rebuilt on load (a sort, ~0.15 s for 882k tokens).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from medusa_lite.errors import MedusaError

DATASTORE_FILE_NAME = "datastore.safetensors"
DATASTORE_FORMAT = "medusa-lite-datastore/1"
REBUILD = "medusa-lite build-datastore"
SEPARATOR = -1  # between documents: no n-gram or continuation crosses it
TOKENS_KEY = "tokens"
# An n-gram is indexed by its token ids packed into one int64 sort key, so n * bits per id <= 63
# (SmolLM2's 49,152 ids take 16 bits: n <= 3). 3 and 4 tied in the policy replay
# (benchmarks/lookup_policy/): a 2-3 token match is what is usually there to find.
DATASTORE_MAX_NGRAM = 3
DATASTORE_MIN_NGRAM = 2
KEY_BITS = 63
# A continuation token needs this share of the occurrences still in play (replay: 0.3-0.5 within
# 0.003x of each other, 0.6 lower).
DATASTORE_MIN_SHARE = 0.4
# Votes are counted over at most this many occurrences (evenly spaced), so that a very common
# n-gram costs no more than a rare one (the replay was the same with 256 or all of them).
MAX_VOTERS = 1024


class DatastoreError(MedusaError, ValueError):
    """A datastore file is missing, corrupt, malformed, or built for another vocabulary."""


@dataclass(frozen=True)
class NgramIndex:
    """Every n-gram of the datastore that is followed by a token, sorted by its packed key."""

    n: int
    keys: torch.Tensor  # [M] int64, sorted
    follows: torch.Tensor  # [M] int64: index of the token after each n-gram


@dataclass(frozen=True)
class Datastore:
    tokens: torch.Tensor  # [L] int64 token ids, documents separated by SEPARATOR
    vocab_size: int
    indexes: tuple[NgramIndex, ...]  # longest n first

    @property
    def num_documents(self) -> int:
        return int((self.tokens == SEPARATOR).sum())

    @property
    def num_tokens(self) -> int:
        """Token ids held, separators not counted."""
        return self.tokens.numel() - self.num_documents

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[torch.Tensor],
        vocab_size: int,
        max_ngram: int = DATASTORE_MAX_NGRAM,
        min_ngram: int = DATASTORE_MIN_NGRAM,
    ) -> Datastore:
        """A datastore of ``documents`` (1-D token id tensors, e.g. the assistant tokens of each training answer)."""
        parts = []
        for document in documents:
            parts += [torch.as_tensor(document, dtype=torch.long).flatten(), torch.tensor([SEPARATOR])]
        if not parts:
            raise DatastoreError("no documents to build a datastore from")
        return cls.from_tokens(torch.cat(parts), vocab_size, max_ngram, min_ngram)

    @classmethod
    def from_tokens(
        cls,
        tokens: torch.Tensor,
        vocab_size: int,
        max_ngram: int = DATASTORE_MAX_NGRAM,
        min_ngram: int = DATASTORE_MIN_NGRAM,
    ) -> Datastore:
        check_tokens(tokens, vocab_size)
        max_ngram = min(max_ngram, max_packed_ngram(vocab_size))
        if not 1 <= min_ngram <= max_ngram:
            raise DatastoreError(
                f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram} (vocabulary of {vocab_size} ids)"
            )
        indexes = tuple(ngram_index(tokens, n, vocab_size) for n in range(max_ngram, min_ngram - 1, -1))
        return cls(tokens=tokens, vocab_size=vocab_size, indexes=indexes)

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        metadata = {
            "format": DATASTORE_FORMAT,
            "vocab_size": str(self.vocab_size),
            "documents": str(self.num_documents),
        }
        save_file({TOKENS_KEY: self.tokens.to(torch.int32).contiguous()}, str(path), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, vocab_size: int | None = None) -> Datastore:
        """Read a saved datastore; ``vocab_size``: the model's, checked against the file's."""
        path = Path(path)
        if path.is_dir():
            raise DatastoreError(f"datastore file {path} is a directory; pass the {DATASTORE_FILE_NAME} inside it")
        if not path.is_file():
            raise DatastoreError(f"datastore file {path} does not exist")
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata, names = handle.metadata() or {}, set(handle.keys())
                tokens = handle.get_tensor(TOKENS_KEY) if names == {TOKENS_KEY} else None
        except (SafetensorError, OSError, ValueError) as error:
            raise DatastoreError(f"datastore file {path} is corrupt or not a safetensors file: {error}") from error
        tokens = check_header(path, metadata, names, tokens)
        try:
            datastore = cls.from_tokens(tokens, int(metadata["vocab_size"]))
        except DatastoreError as error:
            raise DatastoreError(f"datastore file {path}: {error}; the file is corrupt") from error
        if vocab_size is not None:
            datastore.check_fits(vocab_size)
        return datastore

    def check_fits(self, vocab_size: int) -> None:
        """Raise unless the datastore was built for a model with ``vocab_size`` ids."""
        if self.vocab_size != vocab_size:
            raise DatastoreError(
                f"the datastore was built for a vocabulary of {self.vocab_size} ids, the model has "
                f"{vocab_size}: build one for this model (medusa-lite build-datastore)"
            )


def largest_vocabulary() -> int:
    """The most token ids a datastore can index: ``DATASTORE_MIN_NGRAM`` of them must pack into one key."""
    return 2 ** (KEY_BITS // DATASTORE_MIN_NGRAM)


def check_header(path: Path, metadata: dict, names: set, tokens: torch.Tensor | None) -> torch.Tensor:
    """The file's token ids as int64 when its header and tensor follow the format; else a clear error.

    The format: metadata ``format`` = DATASTORE_FORMAT, ``vocab_size`` (decimal, at most
    :func:`largest_vocabulary`), ``documents`` (decimal, the number of separators), and one 1-D
    integer tensor ``tokens``.
    """
    corrupt = f"the file is corrupt: rebuild it ({REBUILD})"
    file_format = metadata.get("format")
    if file_format != DATASTORE_FORMAT:
        known = isinstance(file_format, str) and file_format.startswith(DATASTORE_FORMAT.split("/")[0] + "/")
        hint = f"upgrade medusa-lite or rebuild it ({REBUILD})" if known else f"build one with {REBUILD}"
        raise DatastoreError(
            f"{path} is not a medusa-lite datastore this version reads "
            f"(format {file_format!r}, expected {DATASTORE_FORMAT!r}): {hint}"
        )
    if tokens is None:
        raise DatastoreError(
            f"datastore file {path} must hold exactly one tensor {TOKENS_KEY!r}, found {sorted(names)}; {corrupt}"
        )
    if tokens.dim() != 1 or tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise DatastoreError(
            f"datastore file {path}: {TOKENS_KEY!r} must be a 1-D integer tensor, "
            f"found {tokens.dtype} {tuple(tokens.shape)}; {corrupt}"
        )
    for key in ("vocab_size", "documents"):
        if not str(metadata.get(key, "")).isdigit():
            raise DatastoreError(
                f"datastore file {path}: header field {key!r} must be a whole number, "
                f"found {metadata.get(key)!r}; {corrupt}"
            )
    vocab_size, documents = int(metadata["vocab_size"]), int(metadata["documents"])
    if not 1 <= vocab_size <= largest_vocabulary():
        raise DatastoreError(
            f"datastore file {path}: header says vocab_size {vocab_size}, outside [1, {largest_vocabulary()}] "
            f"(what a datastore can index); {corrupt}"
        )
    tokens = tokens.to(torch.long)
    separators = int((tokens == SEPARATOR).sum())
    if separators != documents:
        raise DatastoreError(
            f"datastore file {path}: header says {documents} documents but the tokens hold {separators}; "
            f"the file was edited or {corrupt.removeprefix('the file is ')}"
        )
    return tokens


def max_packed_ngram(vocab_size: int) -> int:
    """The longest n-gram whose ids pack into one int64 key."""
    return KEY_BITS // id_bits(vocab_size)


def id_bits(vocab_size: int) -> int:
    return max(1, (vocab_size - 1).bit_length())


def check_tokens(tokens: torch.Tensor, vocab_size: int) -> None:
    if tokens.dim() != 1 or tokens.dtype != torch.long:
        raise DatastoreError(f"datastore tokens must be a 1-D int64 tensor, got {tuple(tokens.shape)} {tokens.dtype}")
    if tokens.numel() and (int(tokens.min()) < SEPARATOR or int(tokens.max()) >= vocab_size):
        raise DatastoreError(
            f"datastore holds ids outside [0, {vocab_size}) (separator {SEPARATOR}): min "
            f"{int(tokens.min())}, max {int(tokens.max())}"
        )


def pack(ngrams: torch.Tensor, bits: int) -> torch.Tensor:
    """[..., n] ids -> [...] int64 keys (first id most significant)."""
    keys = torch.zeros(ngrams.shape[:-1], dtype=torch.long)
    for j in range(ngrams.shape[-1]):
        keys = (keys << bits) | ngrams[..., j]
    return keys


def ngram_index(tokens: torch.Tensor, n: int, vocab_size: int) -> NgramIndex:
    """Index the n-grams that lie within one document and are followed by a token of it."""
    if tokens.numel() <= n:
        empty = torch.zeros(0, dtype=torch.long)
        return NgramIndex(n, empty, empty)
    windows = tokens[:-1].unfold(0, n, 1)  # starts 0 .. L-1-n: each has a next token
    follows = torch.arange(n, tokens.numel())
    usable = (windows != SEPARATOR).all(dim=-1) & (tokens[follows] != SEPARATOR)
    keys, order = torch.sort(pack(windows[usable], id_bits(vocab_size)), stable=True)
    return NgramIndex(n, keys, follows[usable][order])


def occurrences(index: NgramIndex, last: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Indices of the tokens that followed ``last`` (the text's last n ids) in the datastore."""
    key = pack(last.view(1, -1).cpu(), id_bits(vocab_size))
    low = int(torch.searchsorted(index.keys, key, right=False))
    high = int(torch.searchsorted(index.keys, key, right=True))
    return index.follows[low:high]


def datastore_continuation(
    datastore: Datastore, history: torch.Tensor, max_tokens: int, min_share: float = DATASTORE_MIN_SHARE
) -> torch.Tensor:
    """Up to ``max_tokens`` ids the datastore votes for after ``history``; empty when nothing matches."""
    empty = history[:0]
    if max_tokens <= 0:
        return empty
    voters = torch.zeros(0, dtype=torch.long)
    for index in datastore.indexes:
        if history.numel() >= index.n:
            voters = occurrences(index, history[-index.n :], datastore.vocab_size)
            if voters.numel():
                break
    if voters.numel() > MAX_VOTERS:
        voters = voters[:: -(-voters.numel() // MAX_VOTERS)]
    chain = []
    tokens = datastore.tokens
    while voters.numel() and len(chain) < max_tokens:
        next_ids = tokens[voters]
        values, counts = torch.unique(next_ids, return_counts=True)
        best = int(torch.argmax(counts))
        if int(values[best]) == SEPARATOR or int(counts[best]) < min_share * voters.numel():
            break
        chain.append(int(values[best]))
        voters = voters[next_ids == values[best]] + 1
        voters = voters[voters < tokens.numel()]
    return torch.tensor(chain, dtype=torch.long, device=history.device)
