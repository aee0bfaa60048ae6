"""Process-wide switches: instrumentation on/off, NVTX ranges, record_function labels.

Every switch is a plain module attribute so that the hot path pays one attribute read; the
functions below are the public way to change and read them. The environment variables are
read once, at import:

- ``INSTRUMENTED_CONVS_DISABLE=1``: start disabled (every step is a no-op).
- ``INSTRUMENTED_CONVS_NVTX=0``: never push NVTX ranges.
- ``INSTRUMENTED_CONVS_RECORD_FUNCTION=0``: never open ``torch.profiler.record_function``.
- ``INSTRUMENTED_CONVS_BACKWARD=0``: never time the backward of steps (see :mod:`._backward`).
- ``INSTRUMENTED_CONVS_BACKWARD_EVERY=N``: how often the backward of a layer call is timed
  (see :func:`configure`; ``1``: every call).

This module imports nothing from the package: it is the bottom of the house.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, NamedTuple, Optional

_FALSE = ("", "0", "false", "no", "off")


def _env_flag(name: str, default: bool) -> bool:
    """Read a boolean environment variable (``1/true/yes/on`` or ``0/false/no/off``)."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in _FALSE


enabled: bool = not _env_flag("INSTRUMENTED_CONVS_DISABLE", False)
nvtx: bool = _env_flag("INSTRUMENTED_CONVS_NVTX", True)
record_function: bool = _env_flag("INSTRUMENTED_CONVS_RECORD_FUNCTION", True)
backward: bool = _env_flag("INSTRUMENTED_CONVS_BACKWARD", True)
#: The default of ``backward_every``: the first 16 calls of each layer, then one in 16.
BACKWARD_EVERY = 16


def _env_every(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    try:
        every = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}") from None
    if every < 1:
        raise ValueError(f"{name} must be a whole number >= 1, not {value!r}")
    return every


backward_every: int = _env_every("INSTRUMENTED_CONVS_BACKWARD_EVERY", BACKWARD_EVERY)


class Settings(NamedTuple):
    """The switches at one moment (see :func:`settings`); ``restore`` puts them back."""

    enabled: bool  #: steps record (:func:`enable` / :func:`disable`)
    nvtx: bool  #: steps push NVTX ranges
    record_function: bool  #: steps open profiler labels while a profiler records
    backward: bool = True  #: steps time their backward too (autograd hooks)
    backward_every: int = BACKWARD_EVERY  #: how often a layer call's backward is timed

    def restore(self) -> None:
        """Set every switch back to the value it has in this snapshot."""
        global enabled, nvtx, record_function, backward, backward_every
        enabled, nvtx, record_function = self.enabled, self.nvtx, self.record_function
        backward, backward_every = self.backward, self.backward_every


def settings() -> Settings:
    """The current switches, as a :class:`Settings` snapshot (``.restore()`` puts them back)."""
    return Settings(enabled, nvtx, record_function, backward, backward_every)


def enable() -> None:
    """Turn instrumentation on (the default unless ``INSTRUMENTED_CONVS_DISABLE=1``)."""
    global enabled
    enabled = True


def disable() -> None:
    """Turn instrumentation off: each step then costs one flag check, layers run stock code."""
    global enabled
    enabled = False


def is_enabled() -> bool:
    """Whether steps are being recorded."""
    return enabled


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Turn instrumentation off inside the block, and restore the previous state after."""
    global enabled
    previous = enabled
    enabled = False
    try:
        yield
    finally:
        enabled = previous


def configure(
    *, nvtx: Optional[bool] = None, record_function: Optional[bool] = None,
    backward: Optional[bool] = None, backward_every: Optional[int] = None,
) -> Settings:
    """Switch NVTX ranges, ``record_function`` labels or backward timing on or off.

    ``None`` keeps a switch as it is. ``backward=False`` takes effect at once: forwards set
    up no autograd hooks, and hooks set up before record nothing.

    ``backward_every=N`` (default 16): the backward of the first N calls of each layer (of
    each step that sets up backward timing, per shape of its autograd graph) is timed, then
    that of one call in N, chosen at random; every other call's backward is counted, and its
    time estimated from the calls timed at random (``Row.estimated`` says how many; the
    table marks such rows). Hooks on autograd nodes cost microseconds each, so timing every
    call's backward would cost more than the rest of the instrumentation together.
    ``backward_every=1`` times every call.

    Returns the switches now in effect (``configure()`` alone only reads them).
    """
    g = globals()  # the parameters shadow the module switches of the same names
    if backward_every is not None:
        if isinstance(backward_every, bool) or not isinstance(backward_every, int) or backward_every < 1:
            raise ValueError(f"backward_every must be a whole number >= 1, not {backward_every!r}")
    if nvtx is not None:
        g["nvtx"] = bool(nvtx)
    if record_function is not None:
        g["record_function"] = bool(record_function)
    if backward is not None:
        g["backward"] = bool(backward)
    if backward_every is not None:
        g["backward_every"] = backward_every
    return settings()
