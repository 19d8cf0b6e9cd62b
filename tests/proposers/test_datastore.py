"""The datastore lookup: the n-gram search and vote, the file, ``load``, and exact greedy decoding with it."""

from pathlib import Path

import pytest
import torch
from tiny_checkpoint import save_tiny_checkpoint
from tiny_models import plain_greedy, random_heads, tiny_base_model

from medusa_lite import MedusaModel, generate
from medusa_lite.artifacts.loading import load
from medusa_lite.decoding.generate import lookup_chain
from medusa_lite.errors import GenerationInputError
from medusa_lite.proposers.datastore import (
    DATASTORE_FILE_NAME,
    SEPARATOR,
    Datastore,
    DatastoreError,
    datastore_continuation,
    max_packed_ngram,
)

VOCAB = 24
MAX_NEW_TOKENS = 40


def ids(*tokens):
    return torch.tensor(tokens, dtype=torch.long)


def store(*documents, vocab_size=VOCAB, **kwargs):
    return Datastore.from_documents([ids(*document) for document in documents], vocab_size, **kwargs)


# -- search and vote ---------------------------------------------------------------------------
def test_continuation_is_voted_token_by_token_among_the_matches():
    datastore = store([1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [7, 2, 3, 4, 5])
    # "2 3" (no earlier "9 2 3") occurs 3 times: all continue with 4, then 5 (2 of 3) wins over 6,
    # then every document ends: the chain stops at the separator.
    assert datastore_continuation(datastore, ids(9, 2, 3), 8).tolist() == [4, 5]
    assert datastore_continuation(datastore, ids(9, 2, 3), 1).tolist() == [4]
    assert datastore_continuation(datastore, ids(9, 2, 3), 0).numel() == 0


def test_the_longest_matching_ngram_wins_over_a_more_frequent_shorter_one():
    datastore = store([5, 2, 3, 4], [1, 2, 3, 7], [1, 2, 3, 7])
    assert datastore_continuation(datastore, ids(5, 2, 3), 4).tolist() == [4]
    assert datastore_continuation(datastore, ids(6, 2, 3), 4).tolist() == [7]


def test_no_continuation_without_a_match_or_without_a_clear_majority():
    datastore = store([1, 2, 3], [1, 2, 4], [1, 2, 5])
    assert datastore_continuation(datastore, ids(9, 1, 2), 4).numel() == 0  # 3, 4, 5: none has 40%
    assert datastore_continuation(datastore, ids(8, 9), 4).numel() == 0  # no match
    assert datastore_continuation(datastore, ids(2), 4).numel() == 0  # shorter than the shortest n-gram


def test_nothing_crosses_a_document_boundary():
    datastore = store([1, 7, 8], [9, 10, 11])
    assert datastore_continuation(datastore, ids(7, 8), 4).numel() == 0  # "7 8" ends a document
    assert SEPARATOR in datastore.tokens.tolist() and datastore.num_documents == 2


def test_ngram_length_is_capped_by_what_packs_into_one_key():
    assert max_packed_ngram(49152) == 3 and max_packed_ngram(128_256) == 3 and max_packed_ngram(VOCAB) == 12
    assert [index.n for index in store([1, 2, 3, 4], max_ngram=8, vocab_size=49152).indexes] == [3, 2]


# -- file ----------------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path):
    datastore = store([1, 2, 3, 4, 5], [1, 2, 3, 6])
    loaded = Datastore.load(datastore.save(tmp_path / DATASTORE_FILE_NAME), VOCAB)
    assert torch.equal(loaded.tokens, datastore.tokens) and loaded.vocab_size == VOCAB
    assert datastore_continuation(loaded, ids(1, 2), 1).tolist() == [3]


def test_bad_files_and_data_are_clear_errors(tmp_path):
    path = store([1, 2, 3]).save(tmp_path / DATASTORE_FILE_NAME)
    with pytest.raises(DatastoreError, match="vocabulary of 24 ids, the model has 50"):
        Datastore.load(path, 50)
    with pytest.raises(DatastoreError, match="does not exist"):
        Datastore.load(tmp_path / "missing.safetensors")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(path.read_bytes()[:20])
    with pytest.raises(DatastoreError, match="corrupt"):
        Datastore.load(corrupt)
    from safetensors.torch import save_file

    other = tmp_path / "weights.safetensors"
    save_file({"weight": torch.zeros(3)}, str(other))
    with pytest.raises(DatastoreError, match="not a medusa-lite datastore"):
        Datastore.load(other)
    with pytest.raises(DatastoreError, match="outside"):
        store([1, 2, 30])
    with pytest.raises(DatastoreError, match="no documents"):
        Datastore.from_documents([], VOCAB)


# -- decoding ------------------------------------------------------------------------------------
def own_answers(base, prompts: list[torch.Tensor]) -> Datastore:
    """A datastore of the target's own greedy answers, as medusa-lite build-datastore makes from self-distilled
    data.
    """
    return Datastore.from_documents(
        [plain_greedy(base, prompt, MAX_NEW_TOKENS)[0, prompt.shape[1] :] for prompt in prompts], VOCAB
    )


def random_prompts(seed: int, count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (1, 6), generator=generator) for _ in range(count)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tree", [[], [(0,), (1,), (0, 0)]], ids=["datastore-only", "tree+lookups"])
def test_greedy_with_a_datastore_is_identical_to_plain_greedy(family, tree):
    base = tiny_base_model(family, vocab_size=VOCAB, seed=3)
    datastore = own_answers(base, random_prompts(11, 12))
    model = MedusaModel(base, random_heads(base, num_heads=3, seed=4), datastore=datastore)
    datastore_steps = 0
    for prompt in random_prompts(12, 4):  # prompts the datastore has not seen
        out = generate(model, prompt, MAX_NEW_TOKENS, tree=tree)
        assert torch.equal(out.sequences, plain_greedy(base, prompt, MAX_NEW_TOKENS))
        datastore_steps += out.stats.datastore_steps
        off = generate(model, prompt, MAX_NEW_TOKENS, tree=tree, datastore=False)
        assert torch.equal(off.sequences, out.sequences) and off.stats.datastore_steps == 0
    assert datastore_steps > 0, "the test never exercised an accepted datastore guess"


def chain_of(history, lookup_tokens, datastore, datastore_tokens):
    chain, from_datastore = lookup_chain(history, lookup_tokens, datastore, datastore_tokens)
    return chain.tolist(), from_datastore


def test_lookup_chain_prefers_a_two_token_text_match_to_the_datastore():
    datastore = store([5, 6, 7, 8])
    # "5 6" matches in the text itself (followed by 9): prompt lookup wins.
    assert chain_of(ids(5, 6, 9, 1, 5, 6), 4, datastore, 4) == ([9, 1, 5, 6], False)
    # Only "6" matches in the text (1 token): the datastore's "5 6" -> 7 8 is used.
    assert chain_of(ids(6, 3, 5, 6), 4, datastore, 4) == ([7, 8], True)
    # No datastore, or datastore_tokens=0: the short text match.
    assert chain_of(ids(6, 3, 5, 6), 4, None, 4) == ([3, 5], False)
    assert chain_of(ids(6, 3, 5, 6), 4, datastore, 0) == ([3, 5], False)
    # Prompt lookup off: the datastore is asked even when the text has a long match.
    assert chain_of(ids(5, 6, 7, 1, 5, 6), 0, datastore, 4) == ([7, 8], True)


def test_wrong_datastore_is_a_clear_error():
    base = tiny_base_model("llama", vocab_size=VOCAB, seed=3)
    heads = random_heads(base, num_heads=2, seed=4)
    with pytest.raises(DatastoreError, match="vocabulary of 50 ids, the model has 24"):
        MedusaModel(base, heads, datastore=store([1, 2], vocab_size=50))
    model = MedusaModel(base, heads)
    with pytest.raises(DatastoreError, match="vocabulary of 50 ids, the model has 24"):
        generate(model, ids(1, 2)[None], 4, datastore=store([1, 2], vocab_size=50))
    with pytest.raises(GenerationInputError, match="datastore must be"):
        generate(model, ids(1, 2)[None], 4, datastore="datastore.safetensors")
    with pytest.raises(GenerationInputError, match="datastore_tokens"):
        generate(model, ids(1, 2)[None], 4, datastore_tokens=-1)


def test_load_finds_the_datastore_beside_the_heads(tmp_path):
    model_dir, heads_dir = save_tiny_checkpoint(tmp_path)
    assert load(model_dir, heads=heads_dir)[0].datastore is None
    vocab_size = load(model_dir, heads=heads_dir)[0].config.vocab_size
    Datastore.from_documents([ids(1, 2, 3)], vocab_size).save(Path(heads_dir) / DATASTORE_FILE_NAME)
    model, _ = load(model_dir, heads=heads_dir)
    assert torch.equal(model.datastore.tokens, ids(1, 2, 3, SEPARATOR))
    assert load(model_dir, heads=heads_dir, datastore=False)[0].datastore is None
    (Path(heads_dir) / DATASTORE_FILE_NAME).write_bytes(b"not a safetensors file")
    with pytest.raises(DatastoreError, match="corrupt"):
        load(model_dir, heads=heads_dir)
