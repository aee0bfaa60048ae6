"""The switches of the process, in one object (:data:`switches`): recording, NVTX ranges,
profiler labels, backward timing, statements, the timeline, counters and memory.

The hot path reads each as one attribute, and so does the C fast path. Change them with
:func:`~instrumented_convs.configure`; the environment variables (docs/guide.rst) are read at
import. Imports nothing from the package.
"""

from __future__ import annotations

import os
from typing import Optional, Union

_FALSE = ("", "0", "false", "no", "off")
_TRUE = ("1", "true", "yes", "on")


def _env_flag(name: str, default: bool) -> bool:
    """Read a boolean environment variable (``1/true/yes/on`` or ``0/false/no/off``, any
    case; empty is off); another word raises ``ValueError`` naming the variable."""
    value = os.environ.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word not in _TRUE and word not in _FALSE:
        raise ValueError(
            f"{name} takes 1, true, yes or on, or 0, false, no or off (empty: off), not {value!r}"
        )
    return word in _TRUE


#: NVTX backends by name; ``auto`` is the default's request (see :func:`configure`).
NVTX_CHOICES = ("auto", "nvtx", "torch", "none")


def nvtx_choice(value: Union[bool, str]) -> str:
    """``value`` as one of :data:`NVTX_CHOICES` (``True`` is ``auto``, ``False`` ``none``)."""
    if value is True:
        return "auto"
    if value is False:
        return "none"
    if isinstance(value, str) and value in NVTX_CHOICES:
        return value
    raise ValueError(
        f"nvtx must be one of {', '.join(map(repr, NVTX_CHOICES))}, True or False, not {value!r}"
    )


def _env_nvtx(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        return "auto"
    v = value.strip().lower()
    if v in _TRUE:
        return "auto"
    if v in _FALSE:
        return "none"
    try:
        return nvtx_choice(v)
    except ValueError:
        raise ValueError(
            f"{name} must be 0, 1 or one of {', '.join(NVTX_CHOICES)}, not {value!r}"
        ) from None


#: What the environment asked of NVTX (``auto`` unless ``INSTRUMENTED_CONVS_NVTX`` says).
NVTX_REQUEST: str = _env_nvtx("INSTRUMENTED_CONVS_NVTX")
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


#: What steps record: ``all`` (times, the default), ``ranges`` (NVTX ranges only, for
#: Nsight Systems) or ``on-demand`` (nothing until a capture asks: see
#: :func:`~instrumented_convs.configure`).
RECORD_MODES = ("all", "ranges", "on-demand")


def record_mode(value: str, name: str = "record") -> str:
    """``value`` as one of :data:`RECORD_MODES`, else ``ValueError`` naming ``name``."""
    if value in RECORD_MODES:
        return value
    raise ValueError(f"{name} must be one of {', '.join(map(repr, RECORD_MODES))}, not {value!r}")


def _env_record(name: str) -> str:
    value = os.environ.get(name)
    return "all" if value is None or not value.strip() else record_mode(value.strip().lower(), name)


#: What the environment asked steps to record (``INSTRUMENTED_CONVS_RECORD``).
RECORD_REQUEST: str = _env_record("INSTRUMENTED_CONVS_RECORD")


class Switches:
    """The switches as the hot path reads them (see :func:`~instrumented_convs.configure` for
    what each means); one instance, :data:`switches`, changed only by ``configure``."""

    __slots__ = (
        "enabled",
        "wanted",
        "drawn",
        "nvtx",
        "record_function",
        "backward",
        "backward_every",
        "statements",
        "timeline",
        "counters",
        "memory",
        "every_before_counters",
        "ranges",
        "every_before_ranges",
        "advise",
    )

    def __init__(self) -> None:
        """The switches as the environment asks for them (defaults elsewhere)."""
        #: Whether steps record now: :attr:`wanted` and :attr:`drawn` (the one flag the hot
        #: path reads; :meth:`apply` keeps it so).
        self.enabled: bool = not _env_flag("INSTRUMENTED_CONVS_DISABLE", False)
        #: What the user asked (``configure(enabled=...)``).
        self.wanted: bool = self.enabled
        #: Whether the duty cycle records this iteration (:mod:`.cycle`; True while it is off).
        self.drawn: bool = True
        #: The NVTX backend in use: ``nvtx``, ``torch`` or ``none`` (what ``configure`` picked
        #: for :data:`NVTX_REQUEST` at import, through :func:`.labels.nvtx.use_nvtx`).
        self.nvtx: str = "none"
        self.record_function: bool = _env_flag("INSTRUMENTED_CONVS_RECORD_FUNCTION", True)
        self.backward: bool = _env_flag("INSTRUMENTED_CONVS_BACKWARD", True)
        self.backward_every: int = _env_every("INSTRUMENTED_CONVS_BACKWARD_EVERY", BACKWARD_EVERY)
        self.statements: bool = _env_flag("INSTRUMENTED_CONVS_STATEMENTS", True)
        self.timeline: int = 0  #: the most calls the timeline records (0: off)
        self.counters: bool = False  #: steps count the FLOPs and bytes of their ops
        self.memory: bool = False  #: steps record what they keep for backward, and peaks
        self.advise: bool = False  #: layers note what the advice's rules read (meters.signals)
        #: ``backward_every`` as it was before the counters set it to 1 (put back after).
        self.every_before_counters: Optional[int] = None
        #: Steps push their NVTX ranges and record nothing (``record="ranges"``); with no
        #: NVTX backend in use they do nothing at all (:meth:`apply`).
        self.ranges: bool = RECORD_REQUEST == "ranges"
        #: ``backward_every`` as it was before ``record="ranges"`` set it to 1.
        self.every_before_ranges: Optional[int] = None
        if self.ranges:  # every call's backward has its ranges
            self.every_before_ranges, self.backward_every = self.backward_every, 1

    def apply(self) -> None:
        """Set :attr:`enabled` from what the user wants and what the duty cycle drew (and, in
        the ranges mode, whether ranges are pushed at all)."""
        self.enabled = self.wanted and self.drawn and not (self.ranges and self.nvtx == "none")

    def __repr__(self) -> str:
        """``Switches(enabled=True, ...)``."""
        return "Switches(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


#: The switches of this process.
switches = Switches()
