"""The cost of one ``step()`` in nanoseconds, measured beside a bare loop in one process.

Variants, interleaved round by round so that machine noise hits each alike:

- ``bare``: the loop body is ``pass`` (subtracted from every other variant);
- ``disabled``: ``with step(name):`` while instrumentation is off;
- ``enabled, no NVTX``: timing and registry only (the default when no NVTX tool is attached);
- ``enabled, NVTX``: plus an NVTX push/pop, the ``nvtx`` package's backend forced on (what a
  step costs under Nsight Systems, minus the tool's own work);
- ``enabled, nested``: a step inside an open step (the usual case inside a layer);
- ``decorated fn, disabled`` / ``enabled``: ``@step(name)`` on a function, minus the call.

Usage: ``python benchmarks/step_cost.py [--n 200000] [--rounds 7] [--breakdown] [--json FILE]``.
Prints the median over rounds of the per-step cost; with ``--json`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

import instrumented_convs as ic
from instrumented_convs.layers import step


def _loop_bare(n: int) -> None:
    for _ in range(n):
        pass


def _loop_step(n: int) -> None:
    for _ in range(n):
        with step("bench"):
            pass


def _loop_nested(n: int) -> None:
    with step("outer"):
        for _ in range(n):
            with step("bench"):
                pass


def _plain() -> None:
    return None


_decorated = step("bench_fn")(_plain)


def _loop_call_plain(n: int) -> None:
    f = _plain
    for _ in range(n):
        f()


def _loop_call_decorated(n: int) -> None:
    f = _decorated
    for _ in range(n):
        f()


def _variants() -> Dict[str, Callable[[int], None]]:
    def disabled(n: int) -> None:
        with ic.configure(enabled=False):
            _loop_step(n)

    def enabled_plain(n: int) -> None:
        with ic.configure(nvtx=False):
            _loop_step(n)

    def enabled_nvtx(n: int) -> None:
        with _nvtx_forced():
            _loop_step(n)

    def fn_disabled(n: int) -> None:
        with ic.configure(enabled=False):
            _loop_call_decorated(n)

    return {
        "bare": _loop_bare,
        "disabled": disabled,
        "enabled, no NVTX": enabled_plain,
        "enabled, NVTX": enabled_nvtx,
        "enabled, nested": _loop_nested,
        "call, plain": _loop_call_plain,
        "decorated fn, disabled": fn_disabled,
        "decorated fn, enabled": _loop_call_decorated,
    }


class _nvtx_forced:
    """Inside the block, NVTX ranges are pushed (the ``nvtx`` package, else torch's) even
    with no tool attached; the switches are put back after."""

    def __enter__(self) -> str:
        self.previous = ic.configure()
        for name in ("nvtx", "torch"):
            ic.configure(nvtx=name)
            if ic.configure().nvtx != "none":
                break
        return ic.configure().nvtx

    def __exit__(self, *exc: object) -> None:
        self.previous.restore()


def _medians(variants: Dict[str, Callable[[int], None]], n: int, rounds: int) -> Dict[str, float]:
    """Median ns per iteration of each variant over ``rounds`` interleaved rounds of ``n``
    (the order reversed every other round; the registry reset after each round)."""
    samples: Dict[str, List[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for name in list(variants) if r % 2 == 0 else reversed(list(variants)):
            t0 = time.perf_counter_ns()
            variants[name](n)
            samples[name].append((time.perf_counter_ns() - t0) / n)
        ic.registry.reset()
    return {k: statistics.median(v) for k, v in samples.items()}


def measure(n: int, rounds: int) -> Dict[str, float]:
    """Median ns per iteration of each variant, bare loop and plain call subtracted."""
    variants = _variants()
    for fn in variants.values():  # warm-up: create registry entries, caches
        fn(min(n, 1000))
    med = _medians(variants, n, rounds)
    out = {}
    for k, v in med.items():
        if k in ("bare", "call, plain"):
            continue
        base = med["call, plain"] if k.startswith("decorated") else med["bare"]
        out[k] = v - base
    out["bare loop (absolute)"] = med["bare"]
    return out


def breakdown(n: int, rounds: int) -> Dict[str, float]:
    """Where an enabled step's time goes, by removing one piece at a time (NVTX forced on).

    This part reaches into the machinery on purpose: it swaps the registry's ``record``
    (what the frame lifecycle calls) for a no-op function on the registry instance.
    """
    from instrumented_convs.core.frames import stack as _stack
    from instrumented_convs.core.storage.registry import registry

    s = step("bench")
    stack = _stack.thread_stack()

    def full(k: int) -> None:
        for _ in range(k):
            with s:
                pass

    def enter_only(k: int) -> None:
        for _ in range(k):
            s.__enter__()
            stack.pop()

    def no_nvtx(k: int) -> None:
        with ic.configure(nvtx=False):
            full(k)

    def no_record(k: int) -> None:
        registry.record = lambda entry, ns, error: None  # type: ignore[method-assign]
        try:
            full(k)
        finally:
            del registry.record  # the class's method again

    variants = {
        "bare": _loop_bare,
        "full": full,
        "enter": enter_only,
        "no_nvtx": no_nvtx,
        "no_record": no_record,
    }
    with _nvtx_forced():
        med = _medians(variants, n, rounds)
    return {
        "whole step, NVTX on": med["full"] - med["bare"],
        "enter (incl. NVTX push)": med["enter"] - med["bare"],
        "exit (incl. NVTX pop)": med["full"] - med["enter"],
        "NVTX push + pop": med["full"] - med["no_nvtx"],
        "registry.record (append, a fold every 64)": med["full"] - med["no_record"],
    }


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    """Run the benchmark and print (and optionally write) the table."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n", type=int, default=200_000, help="steps per variant per round")
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median taken)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument(
        "--breakdown", action="store_true", help="also split an enabled step into its parts"
    )
    args = p.parse_args(argv)
    res = measure(args.n, args.rounds)
    parts = breakdown(args.n, args.rounds) if args.breakdown else {}
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "nvtx_backend": ic.configure().nvtx,
        "n": args.n,
        "rounds": args.rounds,
    }
    print(
        f"step() cost, ns per step (median of {args.rounds} rounds of {args.n}); "
        f"NVTX backend: {info['nvtx_backend']}; torch {info['torch']}"
    )
    for k, v in res.items():
        print(f"  {k:28s} {v:9.1f}")
    if parts:
        print("breakdown of an enabled step, ns:")
        for k, v in parts.items():
            print(f"  {k:28s} {v:9.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"info": info, "ns_per_step": res, "breakdown_ns": parts}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
