"""What counts as an integer or a real number, in an argument or in a file.

One rule for every caller: a Python ``int``, a numpy integer, or a 0-d integer tensor is an
integer; those and a ``float``, a numpy float or a 0-d real tensor are real numbers. A boolean is
neither (``True`` must never be read as 1). Each function returns the plain Python value, or None
when the value is not of that kind, so the caller raises its own error naming the argument or file.
"""

from __future__ import annotations

import numbers
import operator
import reprlib

import numpy as np
import torch

# Error messages quote at most this many characters of a value.
SHOWN_CHARACTERS = 40
_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = SHOWN_CHARACTERS


def is_boolean(value: object) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return True
    return isinstance(value, (torch.Tensor, np.ndarray)) and value.dtype in (torch.bool, np.bool_)


def scalar_tensor(value: object) -> bool:
    """A 0-d tensor whose value can be read (not on the meta device)."""
    return isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_meta


def as_integer(value: object) -> int | None:
    """``value`` as a Python int when it is an integer (not a boolean), else None."""
    if is_boolean(value):
        return None
    if isinstance(value, torch.Tensor):
        integral = not (value.dtype.is_floating_point or value.dtype.is_complex)
        return int(value.item()) if scalar_tensor(value) and integral else None
    try:
        return operator.index(value)
    except TypeError:
        return None


def as_real(value: object) -> float | None:
    """``value`` as a Python float when it is a real number (not a boolean), else None.

    An integer too large for a float is None; infinities and NaN are returned as they are (the
    caller decides whether they are allowed).
    """
    if is_boolean(value):
        return None
    if isinstance(value, torch.Tensor):
        return float(value.item()) if scalar_tensor(value) and not value.dtype.is_complex else None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def describe(value: object) -> str:
    """A short ``type value`` text for error messages: ``float 2.5``, ``bool True``, ``str 'abc'``."""
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, np.generic):  # np.float64(3.0) -> "float64 3.0"
        return f"{type(value).__name__} {_short_repr.repr(value.item())}"
    return f"{type(value).__name__} {_short_repr.repr(value)}"
