"""Synthetic Nsight Systems reports (the SQLite export) for tests of ``report.nsys``.

``build_report`` writes the tables that ``nsys export --type sqlite`` writes, with their
columns in order (the NVTX, string, thread and process tables as nsys 2022.4 writes them; the
CUDA tables as nsys's schema reference gives them), from a short spec: processes, their
threads' NVTX ranges, and the CUDA calls each range makes with the device activity they
launch::

    build_report(path, [
        Proc(pid=100, threads={
            100: [
                RangeSpec("conv", 0, 1000, scope="layer1", launches=[
                    Launch(10, 20, 200, 300),                   # a kernel
                    Launch(30, 40, 310, 360, kind="memcpy"),
                ]),
                RangeSpec("gather", 100, 400),                  # nested in time
            ],
            101: [RangeSpec("conv [backward]", 1100, 1500)],    # another thread
        }),
    ])

The NVTX rows are encoded as nsys does: ours in the domain ``instrumented_convs`` (a domain
creation row, one row naming each category, ranges with registered strings), or with
``domain=False`` as ``torch.cuda.nvtx`` leaves them (the default domain, plain text, no
category). Each process creates the domain and numbers its categories from 1, in the order it
first uses them, as the ``nvtx`` package does; correlation ids count from 1 in each process,
as CUPTI's do.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

__all__ = ["Launch", "RangeSpec", "Proc", "gtid", "gpid", "build_report", "SCHEMA"]

#: nsys's NVTX event types (ENUM_NSYS_EVENT_TYPE): category name, mark, push/pop and
#: start/end range, domain creation.
CATEGORY, MARK, PUSH_POP, START_END, DOMAIN_CREATE = 33, 34, 59, 60, 75
#: The domain id the builder gives ``instrumented_convs``.
DOMAIN_ID = 1
#: The bits above 48 of nsys's serialized global ids (2022.4 writes 1 there, on the host).
HIGH = 1 << 48
#: CUPTI_ACTIVITY_KIND_RUNTIME.eventClass of a CUDA runtime call (ENUM_NSYS_EVENT_CLASS).
RUNTIME_CLASS = 0

#: The columns the activity tables (kernels, copies, memsets) begin with.
_ACTIVITY_COLUMNS = (
    ("start", "INTEGER NOT NULL"),
    ("end", "INTEGER NOT NULL"),
    ("deviceId", "INTEGER NOT NULL"),
    ("contextId", "INTEGER NOT NULL"),
    ("streamId", "INTEGER NOT NULL"),
    ("correlationId", "INTEGER"),
    ("globalPid", "INTEGER"),
)

#: Each table's columns in nsys's order, with their declared types.
SCHEMA: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "StringIds": (("id", "INTEGER NOT NULL PRIMARY KEY"), ("value", "TEXT NOT NULL")),
    "ThreadNames": (
        ("nameId", "INTEGER NOT NULL"),
        ("priority", "INTEGER"),
        ("globalTid", "INTEGER"),
    ),
    "PROCESSES": (("globalPid", "INTEGER"), ("pid", "INTEGER"), ("name", "TEXT")),
    "NVTX_EVENTS": (
        ("start", "INTEGER NOT NULL"),
        ("end", "INTEGER"),
        ("eventType", "INTEGER NOT NULL"),
        ("rangeId", "INTEGER"),
        ("category", "INTEGER"),
        ("color", "INTEGER"),
        ("text", "TEXT"),
        ("globalTid", "INTEGER"),
        ("endGlobalTid", "INTEGER"),
        ("textId", "INTEGER"),
        ("domainId", "INTEGER"),
        ("uint64Value", "INTEGER"),
        ("int64Value", "INTEGER"),
        ("doubleValue", "REAL"),
        ("uint32Value", "INTEGER"),
        ("int32Value", "INTEGER"),
        ("floatValue", "REAL"),
        ("jsonTextId", "INTEGER"),
        ("jsonText", "TEXT"),
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        ("start", "INTEGER NOT NULL"),
        ("end", "INTEGER NOT NULL"),
        ("eventClass", "INTEGER NOT NULL"),
        ("globalTid", "INTEGER"),
        ("correlationId", "INTEGER"),
        ("nameId", "INTEGER NOT NULL"),
        ("returnValue", "INTEGER NOT NULL"),
        ("callchainId", "INTEGER"),
    ),
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        *_ACTIVITY_COLUMNS,
        ("demangledName", "INTEGER NOT NULL"),
        ("shortName", "INTEGER NOT NULL"),
        ("mangledName", "INTEGER"),
        ("launchType", "INTEGER"),
        ("cacheConfig", "INTEGER"),
        ("registersPerThread", "INTEGER NOT NULL"),
        ("gridX", "INTEGER NOT NULL"),
        ("gridY", "INTEGER NOT NULL"),
        ("gridZ", "INTEGER NOT NULL"),
        ("blockX", "INTEGER NOT NULL"),
        ("blockY", "INTEGER NOT NULL"),
        ("blockZ", "INTEGER NOT NULL"),
        ("staticSharedMemory", "INTEGER NOT NULL"),
        ("dynamicSharedMemory", "INTEGER NOT NULL"),
        ("localMemoryPerThread", "INTEGER NOT NULL"),
        ("localMemoryTotal", "INTEGER NOT NULL"),
        ("gridId", "INTEGER NOT NULL"),
        ("sharedMemoryExecuted", "INTEGER"),
        ("graphNodeId", "INTEGER"),
        ("sharedMemoryLimitConfig", "INTEGER"),
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        *_ACTIVITY_COLUMNS,
        ("bytes", "INTEGER NOT NULL"),
        ("copyKind", "INTEGER NOT NULL"),
        ("deprecatedSrcId", "INTEGER"),
        ("srcKind", "INTEGER"),
        ("dstKind", "INTEGER"),
        ("srcDeviceId", "INTEGER"),
        ("srcContextId", "INTEGER"),
        ("dstDeviceId", "INTEGER"),
        ("dstContextId", "INTEGER"),
        ("migrationCause", "INTEGER"),
        ("graphNodeId", "INTEGER"),
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        *_ACTIVITY_COLUMNS,
        ("value", "INTEGER NOT NULL"),
        ("bytes", "INTEGER NOT NULL"),
        ("graphNodeId", "INTEGER"),
        ("memKind", "INTEGER"),
    ),
}
#: The tables of a CUDA trace (left out with ``cuda=False``).
CUDA_TABLES = (
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
)
#: A launch's kind -> its activity table and the API call that makes it.
KINDS: Dict[str, Tuple[Optional[str], str]] = {
    "kernel": ("CUPTI_ACTIVITY_KIND_KERNEL", "cudaLaunchKernel_v7000"),
    "memcpy": ("CUPTI_ACTIVITY_KIND_MEMCPY", "cudaMemcpyAsync_v3020"),
    "memset": ("CUPTI_ACTIVITY_KIND_MEMSET", "cudaMemsetAsync_v3020"),
    "sync": (None, "cudaStreamSynchronize_v3020"),
}


@dataclass
class Launch:
    """One CUDA API call (``api_start``..``api_end`` on the host) and the device activity it
    launched (``dev_start``..``dev_end``): a kernel, a memcpy or a memset, or nothing
    (``kind="sync"``). ``more``: further activities of the same kind under the same correlation
    id, as a CUDA graph's nodes have their launch's id."""

    api_start: int
    api_end: int
    dev_start: int = 0
    dev_end: int = 0
    kind: str = "kernel"
    name: str = "kernel"
    more: Sequence[Tuple[int, int]] = ()
    stream: int = 7
    bytes: int = 4096


@dataclass
class RangeSpec:
    """One NVTX range on a thread (times in ns), its layer (``scope``: an NVTX category of our
    domain), the CUDA calls made on its thread inside it, and its payload
    (``int64Value``, where the ``nvtx`` package puts an int).
    ``start_end``: a start/end range (``nvtx.start_range``) rather than push/pop;
    ``registered``: its text a registered string (``textId``) rather than inline."""

    name: str
    start: int
    end: int
    scope: Optional[str] = None
    launches: Sequence[Launch] = ()
    payload: Optional[int] = None
    start_end: bool = False
    registered: bool = True


@dataclass
class Proc:
    """A process: its ranges by thread id, CUDA calls made outside any range by thread id
    (``launches``), its name, and the marks its main thread made in our domain (``(time,
    text)``: ``settings: rank=1 ...``, ``reset``; ``(time, text, payload)``: ``time``)."""

    pid: int
    threads: Dict[int, Sequence[RangeSpec]] = field(default_factory=dict)
    launches: Dict[int, Sequence[Launch]] = field(default_factory=dict)
    name: str = "python3"
    marks: Sequence[Tuple[Any, ...]] = ()


def gtid(pid: int, tid: int) -> int:
    """nsys's serialized global thread id (the pid in bits 24 to 47, the tid below)."""
    return HIGH | (pid << 24) | tid


def gpid(pid: int) -> int:
    """nsys's serialized global process id (a global thread id with no tid)."""
    return HIGH | (pid << 24)


def build_report(
    path: Union[str, Path],
    processes: Iterable[Proc],
    *,
    domain: bool = True,
    cuda: bool = True,
    omit: Iterable[str] = (),
) -> Path:
    """Write a report of ``processes`` to ``path`` (replaced if there) and return the path.

    ``domain=False``: the ranges as ``torch.cuda.nvtx`` makes them (no domain, no category);
    ``cuda=False``: no CUDA trace tables; ``omit``: tables (``"TABLE"``) or columns
    (``"TABLE.column"``) to leave out, as an older or newer nsys release would."""
    path = Path(path)
    if path.exists():
        path.unlink()
    left_out = set(omit)
    writer = _Writer()
    procs = list(processes)
    for proc in procs:
        writer.process(proc, domain)
    schema = {t: cols for t, cols in SCHEMA.items() if cuda or t not in CUDA_TABLES}
    conn = sqlite3.connect(str(path))
    try:
        for table, cols in schema.items():
            if table in left_out:
                continue
            kept = [(c, ty) for c, ty in cols if f"{table}.{c}" not in left_out]
            conn.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {ty}' for c, ty in kept)})")
            rows = writer.rows.get(table, [])
            if not rows:
                continue
            names = [c for c, _ in kept]
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                [tuple(row.get(c) for c in names) for row in rows],
            )
        conn.commit()
    finally:
        conn.close()
    return path


class _Writer:
    """The rows of every table, as dicts by column, with the strings interned."""

    def __init__(self) -> None:
        self.rows: Dict[str, List[Dict[str, object]]] = {}
        self.strings: Dict[str, int] = {}
        self.categories: Dict[str, int] = {}  # the current process's, as the nvtx package's
        self.domain_made = False

    def string(self, text: str) -> int:
        """The id of ``text`` in StringIds (added on first use)."""
        if text not in self.strings:
            self.strings[text] = len(self.strings) + 1
            self.add("StringIds", id=self.strings[text], value=text)
        return self.strings[text]

    def add(self, table: str, **row: object) -> None:
        """One row of ``table``."""
        self.rows.setdefault(table, []).append(row)

    def process(self, proc: Proc, domain: bool) -> None:
        """The rows of one process: its name, threads, ranges and CUDA calls."""
        self.add("PROCESSES", globalPid=gpid(proc.pid), pid=proc.pid, name=proc.name)
        corr = [0]  # CUPTI's correlation ids: per process
        self.categories, self.domain_made = {}, False  # each process names its own
        tids: Set[int] = set(proc.threads) | set(proc.launches)
        for tid in sorted(tids):
            g = gtid(proc.pid, tid)
            name = "python3" if tid == proc.pid else f"thread {tid}"
            self.add("ThreadNames", nameId=self.string(name), priority=0, globalTid=g)
            for spec in proc.threads.get(tid, ()):
                self.nvtx(spec, g, domain)
                for launch in spec.launches:
                    self.launch(launch, proc.pid, g, corr)
            for launch in proc.launches.get(tid, ()):
                self.launch(launch, proc.pid, g, corr)
        for t, text, *payload in proc.marks:  # (the domain made by the process's ranges first)
            self.add(
                "NVTX_EVENTS",
                start=t,
                eventType=MARK,
                textId=self.string(text),
                globalTid=gtid(proc.pid, proc.pid),
                domainId=DOMAIN_ID,
                int64Value=payload[0] if payload else None,
            )

    def nvtx(self, spec: RangeSpec, g: int, domain: bool) -> None:
        """A range's row (and, first, its domain's and category's)."""
        row: Dict[str, object] = dict(
            start=spec.start,
            end=spec.end,
            eventType=START_END if spec.start_end else PUSH_POP,
            globalTid=g,
            endGlobalTid=g if spec.start_end else None,
            int64Value=spec.payload,
        )
        if spec.start_end:
            row["rangeId"] = len(self.rows.get("NVTX_EVENTS", ())) + 1
        if not domain:
            self.add("NVTX_EVENTS", text=spec.name, domainId=0, **row)
            return
        if not self.domain_made:
            self.domain_made = True
            self.add(
                "NVTX_EVENTS",
                start=0,
                eventType=DOMAIN_CREATE,
                text="instrumented_convs",
                globalTid=g,
                domainId=DOMAIN_ID,
            )
        if spec.scope is not None and spec.scope not in self.categories:
            self.categories[spec.scope] = len(self.categories) + 1
            self.add(
                "NVTX_EVENTS",
                start=0,
                eventType=CATEGORY,
                category=self.categories[spec.scope],
                text=spec.scope,
                globalTid=g,
                domainId=DOMAIN_ID,
            )
        row["category"] = self.categories.get(spec.scope) if spec.scope is not None else None
        if spec.registered:
            row["textId"] = self.string(spec.name)
        else:
            row["text"] = spec.name
        self.add("NVTX_EVENTS", domainId=DOMAIN_ID, **row)

    def launch(self, launch: Launch, pid: int, g: int, corr: List[int]) -> None:
        """A CUDA call's row and those of the activity it launched."""
        table, api = KINDS[launch.kind]
        corr[0] += 1
        self.add(
            "CUPTI_ACTIVITY_KIND_RUNTIME",
            start=launch.api_start,
            end=launch.api_end,
            eventClass=RUNTIME_CLASS,
            globalTid=g,
            correlationId=corr[0],
            nameId=self.string(api),
            returnValue=0,
        )
        if table is None:
            return
        for start, end in [(launch.dev_start, launch.dev_end), *launch.more]:
            row: Dict[str, object] = dict(
                start=start,
                end=end,
                deviceId=0,
                contextId=1,
                streamId=launch.stream,
                correlationId=corr[0],
                globalPid=gpid(pid),
            )
            if launch.kind == "kernel":
                name = self.string(launch.name)
                row.update(
                    demangledName=name,
                    shortName=name,
                    mangledName=name,
                    launchType=0,
                    cacheConfig=0,
                    registersPerThread=32,
                    gridX=1,
                    gridY=1,
                    gridZ=1,
                    blockX=128,
                    blockY=1,
                    blockZ=1,
                    staticSharedMemory=0,
                    dynamicSharedMemory=0,
                    localMemoryPerThread=0,
                    localMemoryTotal=0,
                    gridId=corr[0],
                )
            elif launch.kind == "memcpy":
                row.update(bytes=launch.bytes, copyKind=1, srcKind=0, dstKind=2)
            else:
                row.update(value=0, bytes=launch.bytes, memKind=2)
            self.add(table, **row)
