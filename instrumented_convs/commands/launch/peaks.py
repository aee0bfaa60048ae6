"""The machine's limits for ``run --counters`` and ``view --counters``: probed on the device
the script used, or given (``--peak-gbs``, ``--peak-tflops``), and saved with the run so
that ``view`` reads it against the same roof.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, Optional

from ...report import Peak
from ...roofline import device_of_run, given, probe
from ..errors import USAGE, UserError

__all__ = ["add_peak_options", "check_peaks", "run_peak", "view_peak"]


def add_peak_options(parser: argparse.ArgumentParser) -> None:
    """``--peak-gbs`` and ``--peak-tflops``: the machine's limits, in place of the probe's."""
    parser.add_argument(
        "--peak-gbs",
        type=float,
        metavar="GBS",
        help="with --counters: the memory bandwidth to read the roofline against, GB/s "
        "(default: the probe's)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        metavar="TFLOPS",
        help="with --counters: the arithmetic peak, TFLOP/s (default: the probe's)",
    )


def check_peaks(args: argparse.Namespace) -> None:
    """Refuse a ``--peak-gbs``/``--peak-tflops`` that is not a positive number."""
    for flag in ("peak_gbs", "peak_tflops"):
        value = getattr(args, flag)
        if value is not None and not value > 0:
            name = flag.replace("_", "-")
            raise UserError(f"--{name} takes a positive number, not {value:g}", USAGE)


def run_peak(args: argparse.Namespace) -> Peak:
    """The peak a ``run --counters`` reads its roofline against, saved in the run: the probe
    (:func:`instrumented_convs.roofline.probe`) of the device the script used (a GPU run is
    read against its GPU, never against the CPU), with ``--peak-gbs``/``--peak-tflops`` in
    place of the probe's figures where given (with both given, nothing is probed)."""
    check_peaks(args)
    both = args.peak_gbs is not None and args.peak_tflops is not None
    peak = None if both else probe(device=device_of_run())
    out = given(peak, args.peak_gbs, args.peak_tflops)
    assert out is not None
    return out


def view_peak(args: argparse.Namespace, run: Dict[str, Any]) -> Optional[Peak]:
    """The peak a ``view --counters`` reads a saved run against: the run's own, with the
    figures given on the command line in its place."""
    check_peaks(args)
    saved = Peak(**run["peak"]) if run.get("peak") else None
    return given(saved, args.peak_gbs, args.peak_tflops)
