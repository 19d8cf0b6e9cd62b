"""Random corruptions of the files medusa-lite reads (hypothesis strategies, drawn through ``st.data()``): a JSON
value with one node replaced, deleted or added to; bytes truncated or overwritten; a safetensors file's header
(names, dtypes, shapes, offsets, metadata and the claimed header length) rewritten while its data stays."""

from __future__ import annotations

import json
import struct

from hypothesis import strategies as st

json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.text(max_size=5)
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)


def mutate_json(data, value):
    """``value`` with one randomly chosen node (possibly the whole) replaced, deleted or added to."""
    if isinstance(value, (dict, list)) and value and data.draw(st.booleans()):
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        key = data.draw(st.sampled_from(keys))
        copy = dict(value) if isinstance(value, dict) else list(value)
        action = data.draw(st.sampled_from(["descend", "delete", "add"]))
        if action == "descend":
            copy[key] = mutate_json(data, copy[key])
        elif action == "delete":
            del copy[key]
        elif isinstance(copy, dict):
            copy[data.draw(st.text(max_size=8))] = data.draw(json_values)
        else:
            copy.append(data.draw(json_values))
        return copy
    return data.draw(json_values)


def mutate_bytes(data, raw: bytes) -> bytes:
    """Truncated, or with a few bytes overwritten."""
    if data.draw(st.booleans()):
        return raw[: data.draw(st.integers(0, len(raw)))]
    raw = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    return bytes(raw)


def corrupt_file(data, path, parse_json: bool) -> None:
    raw = path.read_bytes()
    if parse_json and data.draw(st.booleans()):
        path.write_text(json.dumps(mutate_json(data, json.loads(raw))))
    else:
        path.write_bytes(mutate_bytes(data, raw))


HEADER_LENGTH_BYTES = 8  # a safetensors file: the header's length (little-endian u64), the JSON header, the data
HUGE = 2**62  # a size no machine can hold: reading must refuse it, not try to allocate it
SAFETENSORS_DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL", "F8_E4M3"]
shapes = st.one_of(
    st.lists(st.integers(0, 8), max_size=3),
    st.lists(st.sampled_from([-1, 10**12, HUGE]), min_size=1, max_size=2),
    st.just("not a shape"),
)
offsets = st.one_of(
    st.lists(st.integers(0, 4096), min_size=2, max_size=2),
    st.just([HUGE, HUGE + 4]),
    st.lists(st.integers(-4, 4), max_size=3),
)


def split_safetensors(raw: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack("<Q", raw[:HEADER_LENGTH_BYTES])
    header = json.loads(raw[HEADER_LENGTH_BYTES : HEADER_LENGTH_BYTES + length])
    return header, raw[HEADER_LENGTH_BYTES + length :]


def joined_safetensors(header: dict, data: bytes, claimed_length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if claimed_length is None else claimed_length) + text + data


def mutate_tensor_entry(data, entry: dict) -> dict:
    """One tensor's dtype, shape or offsets replaced."""
    entry = dict(entry)
    field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
    entry[field] = data.draw(
        {"dtype": st.one_of(st.sampled_from(SAFETENSORS_DTYPES), st.text(max_size=4)), "shape": shapes}.get(
            field, offsets
        )
    )
    return entry


def mutate_safetensors(data, raw: bytes) -> bytes:
    """A well-formed safetensors file with its header changed: a tensor's dtype, shape or offsets, a tensor
    renamed, dropped or added, the metadata rewritten, or the header's claimed length (too short, too long, huge)."""
    header, payload = split_safetensors(raw)
    names = [name for name in header if name != "__metadata__"]
    how = data.draw(st.sampled_from(["entry", "rename", "drop", "add", "metadata", "length"]))
    if how == "length":
        length = len(json.dumps(header).encode())
        claimed = data.draw(st.sampled_from([0, 1, length - 1, length + 1, length + len(payload) + 1, HUGE]))
        return joined_safetensors(header, payload, claimed)
    name = data.draw(st.sampled_from(names))
    if how == "entry":
        header[name] = mutate_tensor_entry(data, header[name])
    elif how == "rename":
        header[data.draw(st.text(min_size=1, max_size=12))] = header.pop(name)
    elif how == "drop":
        del header[name]
    elif how == "add":
        header[f"{name}.extra"] = mutate_tensor_entry(data, header[name])
    else:
        header["__metadata__"] = mutate_json(data, header.get("__metadata__", {}))
    return joined_safetensors(header, payload)


def corrupt_safetensors(data, path) -> None:
    """``path`` with its header changed (:func:`mutate_safetensors`) or its bytes truncated or overwritten."""
    raw = path.read_bytes()
    path.write_bytes(mutate_safetensors(data, raw) if data.draw(st.booleans()) else mutate_bytes(data, raw))
