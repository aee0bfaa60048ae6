"""Section 5: what this machine is, so that a report says where its figures come from: the
versions against the ranges this release is tested with, the device, the guard's verdicts,
the C fast path, the NVTX backend and ``torch.compile`` (:func:`section`).
"""

from __future__ import annotations

import os
import platform
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import Optional, Tuple

import torch

from ... import configure, core
from ._report import FAIL, PASS, SKIPPED, Section

__all__ = ["TESTED", "section"]

#: (distribution, oldest tested, newest tested): setup.cfg's lower bounds and the releases CI
#: pins at both ends (requirements/main.txt, dgl2.txt, dgl2-nodeps.txt), copied (an
#: installed package need not carry them; tests/test_check.py holds them equal). torch-sparse:
#: the 0.6 series CI builds.
TESTED: Tuple[Tuple[str, str, Optional[str]], ...] = (
    ("torch", "2.2", "2.14.1"),
    ("torch-geometric", "2.3", "2.8.1"),
    ("dgl", "1.1.3", "2.1.0"),
    ("torch-sparse", "0.6", None),
    ("nvtx", "0.2.11", "0.2.17"),
)

ABOUT = (
    "Versions against the ranges this release is tested with, the device, the guard's "
    "verdict on each copied upstream function, the C fast path, NVTX, torch.compile."
)


def _version_line(s: Section, dist: str, low: str, high: Optional[str]) -> None:
    try:
        v = version(dist)
    except PackageNotFoundError:
        s.add(dist, SKIPPED, "not installed")
        return
    tested = f"{low} to {high}" if high else f"{low} and newer"
    if core.version_key(v) < core.version_key(low):
        s.add(dist, FAIL, f"{v}: older than this release runs on ({low})", version=v)
    elif high is not None and core.version_key(v) > core.version_key(
        high
    ):  # setup.cfg admits it: not judged here
        s.add(
            dist,
            SKIPPED,
            f"{v}: newer than tested ({tested}); the copies' guards and torch's private "
            "calls' canaries below say what changed",
            version=v,
        )
    else:
        s.add(dist, PASS, f"{v} (tested {tested})", version=v)


def section(device: torch.device, quick: bool = False, progress: object = None) -> Section:
    """The environment section: the versions against the tested ranges (older than setup.cfg
    admits fails; newer than tested is not judged), the device, the guard's verdict on each
    copied upstream function (a copy not used is SKIPPED: the layer then runs upstream's
    forward, with coarser steps, the same numbers), the C fast path, the NVTX backend and
    whether a tool is attached, and ``torch.compile``."""
    s = Section("5. Environment", ABOUT)
    s.add(
        "python",
        PASS,
        f"{platform.python_version()} on {platform.platform()}",
        version=platform.python_version(),
    )
    for dist, low, high in TESTED:
        _version_line(s, dist, low, high)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            s.add("device", FAIL, f"{device}: torch sees no CUDA device")
        else:
            p = torch.cuda.get_device_properties(device)
            s.add(
                "device",
                PASS,
                f"{device}: {p.name}, compute {p.major}.{p.minor}, "
                f"{p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}",
                name=p.name,
                cuda=torch.version.cuda,
            )
    else:
        s.add(
            "device",
            PASS,
            f"{device}: {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
        )
    for framework, module in (("PyG", "instrumented_convs.pyg"), ("DGL", "instrumented_convs.dgl")):
        try:
            detailed = import_module(module).DETAILED
        except ImportError as exc:
            s.add(f"{framework} copies", SKIPPED, f"needs {exc.name or exc}: not installed")
            continue
        for name, ok in detailed.items():
            s.add(
                f"{framework} copy of {name}",
                PASS if ok else SKIPPED,
                "the installed release matches the copy: detailed steps"
                if ok
                else "the installed release differs: upstream's forward runs, coarser steps, "
                "the same numbers",
            )
    s.add(
        "C fast path",
        PASS if core.IMPLEMENTATION == "C" else SKIPPED,
        "in use" if core.IMPLEMENTATION == "C" else "not built: the Python twin runs (slower)",
    )
    backend = configure().nvtx
    attached = core.nvtx_tool_attached()
    s.add(
        "NVTX",
        PASS,
        f"backend {backend}; a tool is {'' if attached else 'not '}attached"
        + ("" if attached else " (ranges cost nothing until one is)"),
        backend=backend,
        attached=attached,
    )
    compile_ok = hasattr(torch, "compile")
    s.add(
        "torch.compile",
        PASS if compile_ok else SKIPPED,
        "available (steps are skipped inside its traces)" if compile_ok else "not in this torch",
    )
    _private_lines(s)
    return s


def _private_lines(s: Section) -> None:
    """A line per private torch call (``core.torch_calls``): its canary passed (in use), its
    fallback taken (coarser, the same numbers: not a failure), or not used here."""
    for name, what, verdict, instead in core.torch_calls():
        if verdict is None:
            s.add(f"torch: {name}", SKIPPED, f"{what}: not used here")
        elif verdict == "in use":
            s.add(f"torch: {name}", PASS, f"{what}: in use, its canary passed")
        else:
            s.add(f"torch: {name}", SKIPPED, f"{what}: {verdict}; instead, {instead}")
