"""Input validation shared by every public op: each failure is a ValueError saying what was expected."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Sequence

import torch


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    floating: bool = False,
    integer: bool = False,
    finite: bool = False,
) -> torch.Tensor:
    """Check a tensor argument; ``None`` entries in ``shape`` match any size."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims{_fmt(shape)}, got shape {tuple(t.shape)}")
    if shape is not None:
        for want, got in zip(shape, t.shape):
            if want is not None and want != got:
                raise ValueError(f"{name} must have shape {_fmt(shape).strip()}, got {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if integer and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise ValueError(f"{name} must be an integer tensor, got dtype {t.dtype}")
    if finite and values_checked() and not all_finite(t):
        raise ValueError(f"{name} contains NaN or Inf values")
    return t


_TRUSTED = contextvars.ContextVar("dspark_trusted_values", default=False)


@contextlib.contextmanager
def trusted_values():
    """Within it, the public ops skip the checks that read tensor values (ranges, finiteness, that rows are
    distributions) and keep those of shapes and dtypes.

    For a caller that made the inputs itself, such as the decode loop: on a GPU every value a check reads makes
    the host wait for the device, and a round of checked calls waits dozens of times for microseconds of work.
    The decode loop checks what could still go wrong (a target or drafter that returns NaN) with one flag it reads
    back with the round's results.
    """
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


_PASSED: set = set()  # (check, inputs' signature) pairs that passed with values trusted
_MAX_PASSED = 4096


def check_once(check, *args) -> None:
    """``check(*args)``, run once per signature of its inputs while values are trusted.

    Within :func:`trusted_values` the ops' checks read only shapes, dtypes and plain arguments (values only where
    :func:`values_checked`, which is false there), so a verdict is a function of them: the first call with a
    given signature runs the check, later ones look the signature up (a few hundred nanoseconds, against
    microseconds of Python checks on every call of a decode loop). A failure is never remembered. Outside
    :func:`trusted_values`, and while ``torch.compile`` traces, the check always runs. Plain arguments must be
    hashable values (ints, floats, strings, None, tuples of them): an object compared by identity would be
    wrongly remembered.
    """
    if not _TRUSTED.get() or torch.compiler.is_compiling():
        check(*args)
        return
    key = (check, *[(a.shape, a.dtype) if isinstance(a, torch.Tensor) else _signature(a) for a in args])
    if key in _PASSED:
        return
    check(*args)
    if len(_PASSED) >= _MAX_PASSED:
        _PASSED.clear()
    _PASSED.add(key)


def _signature(value: object) -> object:
    """What a check may read of a value when values are trusted: a tensor's shape and dtype (no check reads
    devices); a tuple's (named tuples of weights included) element by element; anything else as itself."""
    if isinstance(value, torch.Tensor):
        return value.shape, value.dtype
    if isinstance(value, tuple):
        return type(value), tuple(_signature(v) for v in value)
    return value


def values_checked() -> bool:
    """Whether checks that read tensor values run: not inside :func:`trusted_values`, and not while
    ``torch.compile`` traces, where reading a value would split the graph at every check (shapes and dtypes are
    still checked, at trace time)."""
    return not _TRUSTED.get() and not torch.compiler.is_compiling()


def check_range(name: str, t: torch.Tensor, low: int, high: int, what: str = "") -> None:
    """``t`` holds integers in ``[low, high]`` (inclusive); ``what`` says what the bounds are."""
    if t.numel() == 0 or not values_checked():
        return
    smallest, largest = (int(v) for v in torch.aminmax(t))
    if smallest < low or largest > high:
        raise ValueError(f"{name} must lie in [{low}, {high}]{what}, got [{smallest}, {largest}]")


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element of ``t`` is finite (an empty tensor is).

    Reads the smallest and largest elements in one pass: min and max propagate NaN, and an infinity is one
    of the two. ``torch.isfinite(t).all()`` makes several passes and a mask as large as ``t``; on the logits
    of one drafted block it is several times slower, and checks run on every drafted block."""
    if t.numel() == 0:
        return True
    if not t.is_floating_point():
        return bool(torch.isfinite(t).all())
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def check_token_range(name: str, tokens: torch.Tensor, vocab_size: int) -> None:
    if tokens.numel() == 0 or not values_checked():
        return
    low, high = (int(v) for v in torch.aminmax(tokens))
    if low < 0 or high >= vocab_size:
        raise ValueError(f"{name} must hold token ids in [0, {vocab_size}), got range [{low}, {high}]")


def check_uniforms(name: str, u: torch.Tensor) -> None:
    if u.numel() == 0 or not values_checked():
        return
    low, high = torch.aminmax(u)
    # Comparisons with NaN are false, so a NaN draw fails the first condition.
    if not (bool(low >= 0) and bool(high < 1)):
        raise ValueError(f"{name} must hold uniform draws in [0, 1)")


def check_sampling(temperature: float, top_k: int | None, top_p: float | None, vocab_size: int) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if top_p is not None and not (0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1] or be None, got {top_p!r}")
    if vocab_size < 1:
        raise ValueError(f"vocabulary must be non-empty, got {vocab_size}")


def _fmt(shape: Sequence[int | None] | None) -> str:
    if shape is None:
        return ""
    return " [" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
