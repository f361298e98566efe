"""Argument checks shared by every part of fastpipe, with one behaviour and one message style.

Each helper returns the checked value in its canonical type (``int``, ``float``, a tuple) and
raises with a message naming the parameter, what was given and what to pass instead. ``bool`` is
never taken for a number: ``True`` is an ``int`` to Python, but ``num_workers=True`` or
``hflip=True`` is almost always a mistake (a flag passed where a count or probability belongs).

``where`` (an op or class name) prefixes the message, as in ``cutout: num_holes must be ...``.
A value of the wrong type raises :class:`ArgumentTypeError`, a ``TypeError`` that is also a
``ValueError``, so code that caught the ``ValueError`` of the checks this module replaced still
catches it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = [
    "ArgumentTypeError",
    "choice",
    "non_negative_float",
    "non_negative_int",
    "optional_seed",
    "pair",
    "positive_float",
    "positive_int",
    "probability",
    "size_pair",
]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (a ``TypeError``; also a ``ValueError`` for the callers that
    caught the ``ValueError`` fastpipe raised before these checks were shared)."""


def _label(name: str, where: str) -> str:
    return f"{where}: {name}" if where else name


def _int(name: str, value: Any, what: str, where: str) -> int:
    label = _label(name, where)
    if isinstance(value, bool):
        raise ArgumentTypeError(
            f"{label} must be {what}, got the bool {value!r}; pass an int, not a flag")
    if not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{label} must be {what}, got {value!r} "
                                f"({type(value).__name__}); pass an int such as {name}=2")
    return int(value)


def positive_int(name: str, value: Any, *, where: str = "") -> int:
    """``value`` as an ``int >= 1``; bools are refused."""
    number = _int(name, value, "a positive int", where)
    if number < 1:
        raise ValueError(f"{_label(name, where)} must be a positive int (>= 1), got {number}")
    return number


def non_negative_int(name: str, value: Any, *, where: str = "") -> int:
    """``value`` as an ``int >= 0``; bools are refused."""
    number = _int(name, value, "an int >= 0", where)
    if number < 0:
        raise ValueError(f"{_label(name, where)} must be an int >= 0, got {number}")
    return number


def _real(name: str, value: Any, what: str, where: str) -> float:
    label = _label(name, where)
    if isinstance(value, bool):
        raise ArgumentTypeError(f"{label} must be {what}, got the bool {value!r}; pass a number, "
                                f"e.g. {name}=0.5 rather than {name}=True")
    if not isinstance(value, numbers.Real):
        raise ArgumentTypeError(
            f"{label} must be {what}, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{label} must be {what}, got {number}")
    return number


def probability(name: str, value: Any, *, where: str = "") -> float:
    """``value`` as a ``float`` in ``[0, 1]``; bools are refused (pass 0.5, not True)."""
    number = _real(name, value, "a probability in [0, 1]", where)
    if not 0.0 <= number <= 1.0:
        raise ValueError(f"{_label(name, where)} must be a probability in [0, 1], got {number}")
    return number


def positive_float(name: str, value: Any, *, where: str = "") -> float:
    """``value`` as a finite ``float > 0``; bools are refused."""
    number = _real(name, value, "a positive number", where)
    if number <= 0:
        raise ValueError(f"{_label(name, where)} must be a positive number, got {number}")
    return number


def non_negative_float(name: str, value: Any, *, where: str = "") -> float:
    """``value`` as a finite ``float >= 0``; bools are refused."""
    number = _real(name, value, "a number >= 0", where)
    if number < 0:
        raise ValueError(f"{_label(name, where)} must be a number >= 0, got {number}")
    return number


def pair(
    name: str, value: Any, *, low: float = 0.0, strict_low: bool = True, where: str = ""
) -> tuple[float, float]:
    """``value`` as a ``(low, high)`` range of floats with ``low <= high``, both above ``low``
    (or at it, with ``strict_low=False``): the shape of ``scale`` and ``ratio``."""
    label = _label(name, where)
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{label} must be a (low, high) pair of numbers, got {value!r}")
    items = list(value)
    if len(items) != 2:
        raise ValueError(f"{label} must be a (low, high) pair, got {len(items)} values: {value!r}")
    first, second = (_real(name, v, "a (low, high) pair of numbers", where) for v in items)
    above = (first > low) if strict_low else (first >= low)
    if not above or first > second:
        relation = ">" if strict_low else ">="
        raise ValueError(f"{label} must be (low, high) with high >= low {relation} {low}, "
                         f"got {tuple(items)!r}")
    return first, second


def size_pair(name: str, value: Any, *, where: str = "") -> tuple[int, int]:
    """An output size as ``(height, width)``: an int means a square, a pair is taken as it is."""
    if isinstance(value, bool) or isinstance(value, numbers.Integral):
        side = positive_int(name, value, where=where)
        return side, side
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        height, width = (positive_int(name, v, where=where) for v in value)
        return height, width
    raise ArgumentTypeError(f"{_label(name, where)} must be an int or a (height, width) pair of "
                            f"ints, got {value!r}")


def choice(name: str, value: T, options: Iterable[T], *, where: str = "") -> T:
    """``value`` when it is one of ``options``, else an error listing them."""
    options = list(options)
    if value not in options:
        listed = ", ".join(repr(o) for o in options)
        raise ValueError(f"{_label(name, where)} must be one of {listed}; got {value!r}")
    return value


def optional_seed(name: str, value: Any, *, where: str = "") -> int | None:
    """A seed: ``None`` or an ``int >= 0`` (bools refused)."""
    if value is None:
        return None
    return non_negative_int(name, value, where=where)


def rank_and_world_size(rank: Any, world_size: Any) -> tuple[int, int]:
    """This process's DDP share: both given, or neither (then ``torch.distributed``'s, when it is
    initialized, else rank 0 of 1)."""
    if (rank is None) != (world_size is None):
        raise ValueError(
            "pass both rank and world_size, or neither (then torch.distributed decides)"
        )
    if rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    rank = non_negative_int("rank", rank)
    world_size = positive_int("world_size", world_size)
    if rank >= world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size
