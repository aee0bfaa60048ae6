"""Shared test helpers: the ``gpu`` skip mark, running a script (or a torchrun job), comparing
outcomes, training.

Import what you need: ``from .helpers import gpu, run_script, outcome, train_losses``.
Fixtures (a clean registry per test, the ``clock`` fake clock) live in ``conftest.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

import pytest
import torch

from instrumented_convs.testing import FakeClock  # noqa: F401  (re-exported for tests)

READ = 1_000  #: ns a :class:`Ticking` clock reading costs


class Ticking:
    """A CPU clock that moves ``READ`` ns at every reading (the tool's cost), and when told
    (``advance``: the work)."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += READ
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


#: The repository root (scripts run from there, with it on ``PYTHONPATH``).
ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")

#: The marks of a test that needs a CUDA device: the ``gpu`` marker (registered in
#: setup.cfg; ``pytest -m gpu`` selects them) and a skip when no device is present. For a
#: whole module: ``pytestmark = GPU_MARKS``.
GPU_MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def gpu(test: T) -> T:
    """Decorator for a test (function or class) that needs a CUDA device: see :data:`GPU_MARKS`."""
    for mark in GPU_MARKS:
        test = mark(test)
    return test


def python_path() -> str:
    """``PYTHONPATH`` for a child interpreter: the repository root, then the parent's."""
    rest = os.environ.get("PYTHONPATH")
    return str(ROOT) + (os.pathsep + rest if rest else "")


def child_env(**more: str) -> Dict[str, str]:
    """The environment of a child interpreter the tests start: this one's, with
    :func:`python_path` and ``DGLBACKEND=pytorch``, then ``more``."""
    return dict(os.environ, PYTHONPATH=python_path(), DGLBACKEND="pytorch", **more)


def run_script(
    *args: str,
    expect: int = 0,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 600,
    warnings: Optional[str] = "ignore::UserWarning",
    cwd: Optional[Path] = None,
) -> "subprocess.CompletedProcess[str]":
    """Run ``python [-W warnings] *args`` from the repository root; check its exit status.

    The child gets ``PYTHONPATH`` = the repository root before the parent's ``PYTHONPATH``
    (the folders over the main environment: torch-sparse, a PyG release) and
    ``DGLBACKEND=pytorch``, plus ``env``; ``cwd`` (default: the root) is where it runs.
    Returns the completed process (``.stdout``, ``.stderr``); a wrong exit status fails the
    test with both streams in the message, led by the lines that say FAIL or name an error
    (:func:`failing_lines`): a long output is cut in the middle where CI prints it.
    """
    from . import forkserver

    full_env = child_env(**(env or {}))
    flags = ["-W", warnings] if warnings else []
    # forked from a server that has imported torch where that is the same (tests/forkserver.py)
    proc = forkserver.run([*flags, *args], full_env, str(cwd or ROOT), timeout)
    if proc is None:
        proc = subprocess.run(
            [sys.executable, *flags, *args],
            cwd=cwd or ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if proc.returncode != expect:
        text = proc.stdout + proc.stderr
        lead = failing_lines(text)
        pytest.fail(
            f"exit status {proc.returncode}, expected {expect}"
            + (f"; the lines that say what failed:\n{lead}" if lead else "")
            + "\n-- the whole output --\n"
            + text,
            pytrace=False,
        )
    return proc


def failing_lines(text: str, limit: int = 40) -> str:
    """The lines of ``text`` that report a failure, each with its indented continuation lines.

    A line counts when it holds the word FAIL or FAILED, or ends a traceback (``SomethingError:``);
    at most ``limit`` lines in all, in order.
    """
    lines, out, keep = text.splitlines(), [], False
    for line in lines:
        hit = re.search(r"\bFAIL(ED)?\b|^\w*(Error|Exception): ", line.strip()) is not None
        if hit or (keep and line.startswith(" " * 8) and line.strip()):
            out.append(line)
            keep = True if hit else keep
        else:
            keep = False
        if len(out) >= limit:
            break
    return "\n".join(out)


def _family(pid: int) -> List[Tuple[int, bytes]]:
    """The descendants of ``pid`` with their command lines, read from /proc (Linux; else none)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{entry}/stat") as fh:
                children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(
                    int(entry)
                )
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                with open(f"/proc/{child}/cmdline", "rb") as fh:
                    found.append((child, fh.read()))
            except OSError:
                continue
            todo.append(child)
    return found


def stop_process(proc: "subprocess.Popen[str]") -> None:
    """End torchrun and its workers. The workers run in sessions of their own, so a signal to
    torchrun's process group misses them: SIGTERM torchrun (it stops its workers), then
    SIGKILL whatever of the family is left (same pid and command line as before)."""
    family = _family(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    for pid, cmdline in family:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if fh.read() != cmdline:
                    continue
            os.kill(pid, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def run_torchrun(
    *args: str, nproc: int = 2, timeout: float = 240, cwd: Optional[Path] = None
) -> "subprocess.CompletedProcess[str]":
    """``python -m torch.distributed.run --standalone --nproc-per-node NPROC ARGS`` from the
    repository root, as a user starts a DDP job; checks the exit status. On a timeout (or an
    error in the test) torchrun and its workers are ended, none left behind."""
    cmd = [
        sys.executable,
        "-W",
        "ignore::UserWarning",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        *args,
    ]
    env = child_env(OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        cmd, cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{out}\n{err}")
    finally:
        if proc.poll() is None:
            stop_process(proc)
            proc.communicate()
    assert proc.returncode == 0, out + err
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def entry_stats(
    name: str, path: str, scope: Optional[str], depth: int, parent: int, *times: int, **more: Any
) -> Any:
    """A registry snapshot's entry (``EntryStats``) of plain data timed at ``times`` (ns):
    a ``step`` unless ``kind`` is in ``more``, its other fields."""
    from instrumented_convs.core.storage.entry import EntryStats

    return EntryStats(
        name=name,
        path=path,
        scope=scope,
        kind=more.pop("kind", "step"),
        depth=depth,
        parent=parent,
        count=len(times),
        total=sum(times),
        sumsq=sum(t * t for t in times),
        min=min(times, default=0),
        max=max(times, default=0),
        **{"errors": 0, "untimed": 0, **more},
    )


def counts(rows: Any) -> Dict[Tuple[str, str], int]:
    """Each row's count by ``(name, phase)``: a summary's, or any rows'."""
    return {(r.name, r.phase): r.count for r in rows}


def random_graph(
    n: int,
    e: int,
    features: int = 16,
    *,
    seed: int = 0,
    self_loops: str = "some",
    coalesced: bool = False,
    classes: int = 0,
) -> Tuple[torch.Tensor, ...]:
    """A generated graph, the tests' one maker: ``x`` (``n`` by ``features``), an
    ``edge_index`` of ``e`` random edges (``coalesced``: repeated ones merged, sorted by
    source then target) and, where ``classes``, labels ``y``; all drawn from one generator
    seeded ``seed``. ``self_loops``: ``some`` (as drawn), ``none`` (removed) or ``all``
    (removed, then one on every node, last)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    ei = torch.randint(0, n, (2, e), generator=g)
    if coalesced:
        key = torch.unique(ei[0] * n + ei[1])
        ei = torch.stack([key // n, key % n])
    if self_loops != "some":
        ei = ei[:, ei[0] != ei[1]]
    if self_loops == "all":
        ei = torch.cat([ei, torch.arange(n).repeat(2, 1)], dim=1)
    labels = (torch.randint(0, classes, (n,), generator=g),) if classes else ()
    return (x, ei, *labels)


def outcome(fn: Callable[[], Any]) -> Tuple[Any, Optional[BaseException]]:
    """``(result, None)`` or ``(None, exception)``: compare failures with the stock layer's."""
    try:
        return fn(), None
    except Exception as exc:
        return None, exc


def train_losses(model: Any, inputs: Any, y: Any, steps: int = 5, lr: float = 0.01) -> list:
    """Train ``model(*inputs)`` with Adam and NLL loss; return the loss of every step."""
    import torch.nn.functional as F

    opt = torch.optim.Adam(model.parameters(), lr=lr)
    trace = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.nll_loss(model(*inputs), y)
        loss.backward()
        opt.step()
        trace.append(loss.item())
    return trace


def gradients(module: torch.nn.Module, leaves: Any) -> Dict[str, torch.Tensor]:
    """Copies of the gradients of ``module``'s parameters (``grad.<name>``) and of the input
    tensors ``leaves`` (``grad.input.<i>``), those that have one (the conv case tables)."""
    out: Dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        if p.grad is not None:
            out[f"grad.{name}"] = p.grad.detach().clone()
    for i, leaf in enumerate(leaves):
        if leaf.grad is not None:
            out[f"grad.input.{i}"] = leaf.grad.detach().clone()
    return out


def spans(trace: Dict[str, Any], ph: str = "X") -> List[Dict[str, Any]]:
    """The events of a Chrome trace of one phase type (``X``: complete events)."""
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def assert_nested(trace: Dict[str, Any]) -> None:
    """Every track's complete events nest strictly (the trace format's rule for a track)."""
    tracks: Dict[Tuple[Any, Any], List[Dict[str, Any]]] = {}
    for e in spans(trace):
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for evs in tracks.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        ends: List[float] = []
        for e in evs:
            while ends and ends[-1] <= e["ts"] + 1e-6:  # ended (float sums: 1e-6 us slack)
                ends.pop()
            assert not ends or e["ts"] + e["dur"] <= ends[-1] + 1e-6, e
            ends.append(e["ts"] + e["dur"])


def module_from(source: str, name: str, tmp_path: Path, monkeypatch: Any) -> Iterator[Any]:
    """A module of our own standing for an upstream one, written to ``tmp_path`` and imported
    from its file (``.path`` says where): a fixture's body; it is forgotten afterwards."""
    import importlib

    path = tmp_path / f"{name}.py"
    path.write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module(name)
    mod.path = path
    yield mod
    sys.modules.pop(name, None)


def integration(module: str) -> Any:
    """Import ``module`` (a package of an integration: ``lightning``, ``tensorboard``,
    ``nbclient``), or skip the test saying why; under ``INSTRUMENTED_CONVS_EXPECT_INTEGRATIONS=1``
    (CI, in the integrations folder of ``scripts/env.sh``) its absence fails instead."""
    if os.environ.get("INSTRUMENTED_CONVS_EXPECT_INTEGRATIONS") == "1":
        import importlib

        return importlib.import_module(module)
    why = f"{module} is not installed (scripts/env.sh integrations)"
    return pytest.importorskip(module, reason=why)
