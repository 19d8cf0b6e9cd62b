"""Hidden-state cache: run the frozen body once, train the heads from disk for every epoch.

For each sequence only the span of positions that can train a head is kept: from
``first_target - 1 - K`` (head K's earliest row) to ``last_target`` (exclusive; also covers the
rows at n+k that distillation reads). States are stored in bfloat16 (as raw uint16 bits in
``.npy`` shards, memory-mapped when read), ``positions * hidden_size * 2`` bytes in all; the size
is computed and checked against ``max_cache_gb`` before anything is written.

A cache is valid for one (model, data, max_length, num_heads) combination: ``cache_info.json``
holds a fingerprint of all of them and is written last, so a half-built cache (killed run) or a
cache of other data is rebuilt, never silently reused.

Pays off from the second epoch on: building it costs one body forward per sequence (as one
epoch of direct training does), every later epoch and every evaluation skips the body.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from medusa_lite.training.config import GIGABYTE
from medusa_lite.training.data import Sample, collate
from medusa_lite.training.errors import HiddenCacheError

INFO_NAME = "cache_info.json"
BYTES_PER_VALUE = 2  # bfloat16
SHARD_SEQUENCES = 512
CACHE_VERSION = 1


def cache_span(loss_mask: torch.Tensor, num_heads: int, from_start: bool = False) -> tuple[int, int]:
    """[start, end) of the positions of one sequence that train any head (see module doc).

    ``from_start``: from position 0 (a sequential drafter attends to every earlier position, the
    prompt's included).
    """
    target_positions = torch.nonzero(loss_mask[2:], as_tuple=True)[0] + 2
    if target_positions.numel() == 0:
        return 0, 0
    first, last = int(target_positions[0]), int(target_positions[-1])
    return (0 if from_start else max(0, first - 1 - num_heads)), last


def estimate_cache_bytes(samples: list[Sample], hidden_size: int, num_heads: int, from_start: bool = False) -> int:
    positions = sum(end - start for start, end in (cache_span(s.loss_mask, num_heads, from_start) for s in samples))
    return positions * hidden_size * BYTES_PER_VALUE


def fingerprint(
    samples: list[Sample],
    *,
    model_name: str,
    hidden_size: int,
    num_heads: int,
    from_start: bool = False,
    layers: list[int] | None = None,
) -> str:
    """Of everything a cache's content depends on; ``layers``: the target layers stored (None: the final one)."""
    digest = hashlib.sha256()
    described = {"model": model_name, "hidden": hidden_size, "heads": num_heads, "version": CACHE_VERSION}
    if from_start:  # only then: the fingerprints of existing heads caches stay as they were
        described["from_start"] = True
    if layers is not None:  # likewise
        described["layers"] = list(layers)
    digest.update(json.dumps(described).encode())
    for sample in samples:
        digest.update(sample.input_ids.numpy().tobytes())
        digest.update(sample.loss_mask.numpy().tobytes())
    return digest.hexdigest()


def read_info(cache_dir: Path) -> dict | None:
    path = cache_dir / INFO_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def check_size(needed_bytes: int, max_cache_gb: float, cache_dir: Path) -> None:
    needed_gb = needed_bytes / GIGABYTE
    if needed_gb > max_cache_gb:
        raise HiddenCacheError(
            f"the hidden-state cache would take {needed_gb:.3g} GB (> max_cache_gb = {max_cache_gb}); "
            "raise max_cache_gb, use less data or a smaller max_length, or set precompute_hidden: false"
        )
    free = shutil.disk_usage(nearest_existing(cache_dir)).free
    if needed_bytes > free:
        raise HiddenCacheError(
            f"the hidden-state cache needs {needed_gb:.3g} GB but {cache_dir} has only {free / GIGABYTE:.3g} GB free"
        )


def nearest_existing(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def shard_name(index: int) -> str:
    return f"hidden-{index:05d}.npy"


def write_array_atomically(path: Path, array: np.ndarray) -> None:
    temp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    with open(temp, "wb") as handle:
        np.save(handle, array)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def to_bf16_bits(hidden: torch.Tensor) -> np.ndarray:
    return hidden.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)


def from_bf16_bits(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(bits, copy=True).view(np.int16)).view(torch.bfloat16)


def build_cache(
    samples: list[Sample],
    hidden_fn,
    cache_dir: Path,
    *,
    fingerprint_value: str,
    num_heads: int,
    hidden_size: int,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    wait_for_everyone=lambda: None,
    progress=None,
    from_start: bool = False,
) -> None:
    """Compute and store the spans' hidden states; ranks split the shards between them.

    ``hidden_fn(batch) -> [B, T, H]`` runs the frozen body. Shard i holds sequences
    [i * SHARD_SEQUENCES, (i+1) * SHARD_SEQUENCES); rank r builds shards r, r + world_size, ...
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0 and (cache_dir / INFO_NAME).exists():
        (cache_dir / INFO_NAME).unlink()  # stale: invalidate before rebuilding
    wait_for_everyone()
    spans = [cache_span(s.loss_mask, num_heads, from_start) for s in samples]
    num_shards = (len(samples) + SHARD_SEQUENCES - 1) // SHARD_SEQUENCES
    for shard in range(rank, num_shards, world_size):
        first = shard * SHARD_SEQUENCES
        members = list(range(first, min(first + SHARD_SEQUENCES, len(samples))))
        rows = []
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            batch = collate([samples[i] for i in chunk])
            with torch.no_grad():
                hidden = hidden_fn(batch)
            for row, i in enumerate(chunk):
                begin, end = spans[i]
                rows.append(hidden[row, begin:end].float().cpu())
            if progress is not None:
                progress(len(chunk))
        stacked = torch.cat(rows) if rows else torch.zeros(0, hidden_size)
        write_array_atomically(cache_dir / shard_name(shard), to_bf16_bits(stacked))
    wait_for_everyone()
    if rank == 0:
        info = {
            "fingerprint": fingerprint_value,
            "num_sequences": len(samples),
            "num_shards": num_shards,
            "shard_sequences": SHARD_SEQUENCES,
            "hidden_size": hidden_size,
            "num_heads": num_heads,
            "from_start": from_start,
            "positions": sum(e - s for s, e in spans),
            "version": CACHE_VERSION,
        }
        temp = cache_dir / f".tmp-{INFO_NAME}"
        temp.write_text(json.dumps(info, indent=2))
        os.replace(temp, cache_dir / INFO_NAME)
    wait_for_everyone()


class HiddenCache:
    """Read access to a built cache: ``batch_hidden(indices, length)`` -> [B, T, H] (zeros outside spans)."""

    def __init__(self, cache_dir: Path, samples: list[Sample], num_heads: int, from_start: bool = False):
        info = read_info(cache_dir)
        if info is None:
            raise HiddenCacheError(f"{cache_dir} holds no complete hidden-state cache ({INFO_NAME} missing)")
        self.hidden_size = info["hidden_size"]
        self.spans = [cache_span(s.loss_mask, num_heads, from_start) for s in samples]
        self.shards = [np.load(cache_dir / shard_name(i), mmap_mode="r") for i in range(info["num_shards"])]
        self.locations = []  # sequence -> (shard, first row)
        for shard in range(info["num_shards"]):
            offset = 0
            for i in range(shard * SHARD_SEQUENCES, min((shard + 1) * SHARD_SEQUENCES, len(samples))):
                self.locations.append((shard, offset))
                offset += self.spans[i][1] - self.spans[i][0]
            if offset != self.shards[shard].shape[0]:
                raise HiddenCacheError(
                    f"{cache_dir / shard_name(shard)} holds {self.shards[shard].shape[0]} rows, expected "
                    f"{offset}: the cache is corrupt; delete it"
                )

    def batch_hidden(self, indices: list[int], length: int) -> torch.Tensor:
        hidden = torch.zeros(len(indices), length, self.hidden_size, dtype=torch.bfloat16)
        for row, i in enumerate(indices):
            start, end = self.spans[i]
            shard, offset = self.locations[i]
            hidden[row, start:end] = from_bf16_bits(self.shards[shard][offset : offset + end - start])
        return hidden
