"""Files that prove they were run: unpickling :class:`Payload` creates its marker file."""

from __future__ import annotations

import pickle
from pathlib import Path


class Payload:
    """Unpickling it creates ``marker``: the proof that a pickle was run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def pickle_bytes(marker: Path) -> bytes:
    """A pickle that creates ``marker`` when loaded, shaped like a state dict."""
    return pickle.dumps({"heads.0.weight": Payload(marker)})
