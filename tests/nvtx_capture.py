"""Capture the NVTX ranges a Python snippet really opens, through an injection library.

``build_injection(tmpdir)`` compiles ``tests/nvtx_inject/inject.c`` with the C compiler
against the NVTX headers of the ``nvidia-nvtx-cu12`` wheel; ``capture(code)`` runs the
snippet in a fresh interpreter with ``NVTX_INJECTION64_PATH`` pointing at the library (NVTX
reads it once, at the first NVTX call of a process, hence the subprocess) and returns the
recorded events.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "nvtx_inject" / "inject.c"


def nvtx_include_dir() -> Optional[Path]:
    """The ``include`` folder of the nvidia-nvtx wheel, if installed."""
    try:
        import nvidia.nvtx  # type: ignore[import-not-found]
    except ImportError:
        return None
    for base in getattr(nvidia.nvtx, "__path__", []):
        inc = Path(base) / "include"
        if (inc / "nvtx3" / "nvToolsExt.h").exists():
            return inc
    return None


def compiler() -> Optional[str]:
    """A C compiler on PATH (``$CC``, gcc, cc or clang), or None."""
    for name in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_injection(outdir: Path) -> Path:
    """Compile the injection library into ``outdir`` and return its path."""
    cc, inc = compiler(), nvtx_include_dir()
    if cc is None or inc is None:
        raise RuntimeError("needs a C compiler and the nvidia-nvtx-cu12 headers")
    lib = outdir / "libic_nvtx_inject.so"
    subprocess.run(
        [
            cc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            f"-I{inc}",
            "-o",
            str(lib),
            str(SOURCE),
            "-lpthread",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return lib


@dataclass(frozen=True)
class Event:
    """One recorded NVTX call."""

    kind: str  # "push" or "pop"
    tid: int
    depth: int
    domain: str
    message: str = ""


def parse(text: str) -> Tuple[bool, List[Event]]:
    """The init status and the events of an injection log."""
    ok, events = False, []
    for line in text.splitlines():
        parts = line.split("\t")
        if parts[0] == "init":
            ok = parts[1] == "1"
        elif parts[0] == "push":
            events.append(Event("push", int(parts[1]), int(parts[2]), parts[3], parts[4]))
        elif parts[0] == "pop":
            events.append(Event("pop", int(parts[1]), int(parts[2]), parts[3]))
    return ok, events


def capture(
    lib: Path, code: str, workdir: Path, env: Optional[Dict[str, str]] = None
) -> Tuple[subprocess.CompletedProcess, List[Event]]:
    """Run ``code`` with the injection library attached; return the process and its events."""
    log = workdir / f"nvtx-{os.getpid()}-{abs(hash(code))}.tsv"
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env["NVTX_INJECTION64_PATH"] = str(lib)
    full_env["IC_NVTX_LOG"] = str(log)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=300
    )
    if not log.exists():
        return proc, []
    ok, events = parse(log.read_text())
    if not ok:
        raise RuntimeError("the injection library could not patch the NVTX tables")
    return proc, events


def ranges(events: List[Event], domain: str = "instrumented_convs") -> List[Tuple[int, str]]:
    """(depth, name) of every push in ``domain``, in order."""
    return [(e.depth, e.message) for e in events if e.kind == "push" and e.domain == domain]


def balanced(events: List[Event]) -> bool:
    """Whether every thread's pushes and pops pair up and never go below zero."""
    depth: Dict[Tuple[int, str], int] = {}
    for e in events:
        key = (e.tid, e.domain)
        depth[key] = depth.get(key, 0) + (1 if e.kind == "push" else -1)
        if depth[key] < 0:
            return False
    return all(v == 0 for v in depth.values())
