"""On demand, the job's side: a thread that listens for ``capture`` on a Unix socket the job
made and announced (:mod:`.listening`), and a thread that hands each capture over to be
written as a run folder of its own inside the job's, by a process of its own
(:mod:`.capture_folder`), so that the training loop waits neither for a request nor for the
writing (on CUDA, the capture's event pairs are read on that thread, as a summary reads them).

``run --on-demand`` and Lightning's ``ConvProfiler`` start a :class:`Server` with their run
folder; ``configure(record="on-demand")`` in a script of one's own starts one through
:func:`switch`, in ``configure(captures=DIR)`` or a new ``ic-runs/<script>-<time>``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ... import configure, core, registry
from ...report import write_whole
from .capture_folder import write_capture
from .folders import default_folder, job_rank
from .listening import (
    announcement_name,
    read_message,
    sockets_folder,
    started_at,
    write_message,
)
from .runs import run_meta

__all__ = ["Server", "listen", "stop", "switch", "current", "capture_title"]

logger = logging.getLogger(__name__)

#: What a capture's meta is made from: the capture's description -> run_meta's dict.
Describe = Callable[[Dict[str, Any]], Dict[str, Any]]


def capture_title(target: str, capture: Dict[str, Any]) -> str:
    """``instrumented_convs capture-2: train.py, iterations 40-59``."""
    span = (
        f"iterations {capture['first']}-{capture['last']}"
        if capture.get("first") is not None
        else "no iteration"
    )
    name = capture["name"]  # (``capture``'s names say it: ``capture-2``)
    called = name if name.startswith("capture") else f"capture {name}"
    return f"instrumented_convs {called}: {target}, {span}"


class Server:
    """Listens for captures and writes them, for this process (see the module docstring).

    ``folder``: the run folder (announcements and captures go there); ``describe``: what a
    capture's run.json says of the job (:func:`~.runs.run_meta`'s dict); ``job``: ``(rank,
    world size)`` (default: torchrun's); ``timeline``: captures keep their timeline (None:
    where ``configure(timeline=N)`` records one);
    ``counters``, ``memory``: on in captured iterations only; ``merge_timeout``: how long
    rank 0 waits for the other ranks' files of a capture."""

    def __init__(
        self,
        folder: "str | os.PathLike[str]",
        describe: Describe,
        job: Optional[Tuple[Optional[int], Optional[int]]] = None,
        timeline: Optional[bool] = None,
        counters: bool = False,
        memory: bool = False,
        merge_timeout: float = 60.0,
    ) -> None:
        """A server, not yet started (:meth:`start`)."""
        self.folder = Path(folder)
        self.describe = describe
        self.job = job if job is not None else job_rank()
        self.timeline = timeline
        self.counters, self.memory = counters, memory
        self.merge_timeout = merge_timeout
        self.captures: List[Dict[str, Any]] = []  #: the captures written, in order
        self.pid = os.getpid()
        self.socket_path: Optional[Path] = None
        self._files: List[Path] = []
        self._sock: Optional[socket.socket] = None
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._results: Dict[str, Dict[str, Any]] = {}
        self._events: Dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._metered: List[str] = []  # what a capture turned on (counters, memory)
        self._stopped = False

    # -- starting and stopping --------------------------------------------------------------
    def start(self) -> "Server":
        """Make the socket, announce it, start the threads, take the core's hand-overs."""
        self.folder.mkdir(parents=True, exist_ok=True)
        sockets = sockets_folder(create=True)
        _prune(sockets)
        path = sockets / f"{self.pid}.sock"
        path.unlink(missing_ok=True)  # a socket of an earlier process of this pid
        self._sock, self.socket_path = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), path
        try:
            self._sock.bind(str(path))
            os.chmod(path, 0o600)
            self._sock.listen(8)
            self._announce(sockets)
        except BaseException:
            self._close()
            raise
        demand = core.on_demand
        demand.began, demand.finished = self._began, self._finished
        demand.listening = True
        for target, name in ((self._accept, "listener"), (self._writer, "writer")):
            thread = threading.Thread(target=target, name=f"instrumented_convs {name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("on demand: listening for captures in %s (pid %d)", self.folder, self.pid)
        return self

    def _announce(self, sockets: Path) -> None:
        """Say where this process listens: in the run folder, and by its pid."""
        rank, world = self.job
        announcement = {
            "pid": self.pid,
            "started": started_at(self.pid),
            "ppid": os.getppid(),
            "socket": str(self.socket_path),
            "folder": str(self.folder.resolve()),
            "rank": rank,
            "world": world,
            "host": socket.gethostname(),
        }
        for file in (self.folder / announcement_name(rank), sockets / f"{self.pid}.json"):
            self._files.append(file)
            _write_json(file, announcement)

    def _close(self) -> None:
        """Stop listening and take the announcements back."""
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # (wakes the listener's accept)
            except OSError:
                pass
            self._sock.close()
        for file in [*self._files, self.socket_path]:
            if file is not None:
                file.unlink(missing_ok=True)

    def stop(self, reason: str = "the job ended") -> None:
        """Hand over the capture under way as it is (``reason`` says why it is cut short),
        wait for its folder to be written, stop listening, take the announcements back."""
        if self._stopped:
            return
        self._stopped = True  # (a request now is answered that the job is ending)
        self._close()
        demand = core.on_demand
        demand.stop(reason)
        self._queue.put(None)
        for thread in self._threads[1:]:
            thread.join(timeout=self.merge_timeout + 60)
        if demand.finished == self._finished:
            demand.began = demand.finished = None
            demand.listening = False

    # -- the loop's thread ------------------------------------------------------------------
    def _began(self, capture: Any) -> None:
        """A capture's warm-up begins: the counters and memory on for it (a failure said,
        never raised into the training loop)."""
        try:
            if self.counters:
                configure(counters=True)
                self._metered.append("counters")
            if self.memory:
                configure(memory=True)
                self._metered.append("memory")
        except Exception:
            logger.warning("on demand: the counters or memory did not come on", exc_info=True)
        first = capture.start if capture.warm is None else capture.warm + 1
        logger.info(
            "on demand: capture %s records %d iterations from iteration %d",
            capture.name,
            capture.iterations,
            first,
        )

    def _finished(self, capture: Any) -> None:
        """A capture is handed over: what ``_began`` turned on off, the writer's turn."""
        while self._metered:
            meter = self._metered.pop()
            try:
                configure(**{meter: False})
            except Exception:  # (memory comes off on the thread that turned it on only)
                logger.warning("on demand: the %s did not come off", meter, exc_info=True)
        self._queue.put(capture)

    # -- the listener -----------------------------------------------------------------------
    def _accept(self) -> None:
        sock = self._sock
        while sock is not None and not self._stopped:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed (stop)
            if not _same_user(conn):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _ids(self) -> Dict[str, Any]:
        return {"pid": self.pid, "rank": self.job[0], "world": self.job[1]}

    def _serve(self, conn: socket.socket) -> None:
        """One request: ``status``, ``capture`` (answered when it is armed, again when it is
        written) or ``cancel``."""
        try:
            with conn, conn.makefile("rb") as stream:
                msg = read_message(stream) or {}
                op = msg.get("op")
                if op == "status":
                    status = {**core.on_demand.status(), **self._ids(), "time": time.time()}
                    write_message(conn, status)
                elif op == "capture":
                    self._capture(conn, msg)
                elif op == "cancel":
                    gone = core.on_demand.cancel(str(msg.get("name")))
                    write_message(conn, {"ok": True, "cancelled": gone, **self._ids()})
                else:
                    write_message(conn, {"ok": False, "error": f"no request {op!r}"})
        except (OSError, ValueError):  # the asker went away, or sent what is not JSON
            return

    def _capture(self, conn: socket.socket, msg: Dict[str, Any]) -> None:
        name, iterations, start = msg.get("name"), msg.get("iterations"), msg.get("start")
        if not (
            isinstance(name, str)
            and name
            and isinstance(iterations, int)
            and iterations >= 1
            and (start is None or isinstance(start, int))
        ):
            write_message(conn, {"ok": False, "error": f"not a capture request: {msg}"})
            return
        if self._stopped:
            write_message(conn, {"ok": False, "error": "the job is ending", **self._ids()})
            return
        event = threading.Event()
        with self._lock:
            self._events[name] = event
        try:
            c = core.on_demand.ask(iterations, start, name)
        except core.Busy as e:
            with self._lock:
                self._events.pop(name, None)
            write_message(conn, {"ok": False, "error": str(e), "late": e.late, **self._ids()})
            return
        write_message(conn, {"ok": True, "capture": c.describe(), **self._ids()})
        event.wait()
        write_message(conn, self._results.get(name, {"ok": False, "error": "not written"}))

    # -- the writer -------------------------------------------------------------------------
    def _writer(self) -> None:
        while True:
            capture = self._queue.get()
            if capture is None:
                return
            try:
                result = self._write(capture)
            except Exception as e:  # never the training's fault: said, and the next may come
                logger.exception("on demand: capture %s was not written", capture.name)
                result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            result.update(self._ids(), capture=capture.describe())
            core.on_demand.written(capture)
            with self._lock:
                self._results[capture.name] = result
                event = self._events.pop(capture.name, None)
            if event is not None:
                event.set()

    def _write(self, capture: Any) -> Dict[str, Any]:
        """Write ``capture``'s folder (rank 0 merges the ranks' files); what ``capture`` is
        told of it."""
        rank, world = self.job
        folder = self.folder / capture.name
        info = capture.describe()
        if capture.state in ("cancelled", "missed"):
            dropped = {"ok": False, "error": capture.reason or "cancelled", "state": capture.state}
            if capture.state == "missed" and world is not None:  # rank 0 merges without it
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"rank{rank}.missed").write_text(str(capture.reason) + "\n")
                if rank == 0:  # (the others' files, merged)
                    raw = {"folder": str(folder), "snapshot": None, "merge": world}
                    dropped["merged"] = write_capture(dict(raw, merge_timeout=self.merge_timeout))
            return dropped
        meta = self.describe(info)
        info["of"] = core.on_demand.named and configure().iteration or "optimizer step"
        info["job"] = {"pid": self.pid, "folder": str(self.folder.resolve())}
        target = str(meta.get("target") or "python")
        meta.update(
            capture=info, ended_by="captured", exit_code=None, title=capture_title(target, info)
        )
        timeline, name = None, None
        if self.timeline or (self.timeline is None and configure().timeline):
            name = f"rank {rank}" if world is not None else f"{Path(target).name} ({self.pid})"
            timeline = registry.timeline()  # (on CUDA: waits for the capture's events, here)
            t0 = capture.t0  # (a step the warm-up left open closed after: not the capture's)
            timeline.calls = [call for call in timeline.calls if t0 is None or call[5] >= t0]
        raw = {
            "folder": str(folder),
            "snapshot": registry.snapshot(),
            "meta": meta,
            "job": self.job,
            "timeline": timeline,
            "trace_name": name,
            "merge": world if world is not None and rank == 0 else None,
            "merge_timeout": self.merge_timeout,
        }
        merged = write_capture(raw)  # (in a process of its own)
        self.captures.append(dict(info, folder=str(folder)))
        logger.info("on demand: capture %s written in %s", capture.name, folder)
        return {"ok": True, "folder": str(folder), "merged": merged}


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` runs as this user (or root); Linux's SO_PEERCRED."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return True  # the socket's folder and mode are this user's alone
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, 12))
    return uid in (os.getuid(), 0)


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    write_whole(path, json.dumps(data, indent=1))


# -- the process's server -----------------------------------------------------------------
_current: Optional[Server] = None
#: The last server's folder, description, options and captures: on demand again in this
#: process (``with configure(record="all"): ...`` and back) listens where it did.
_last: Optional[Tuple[Path, Describe, Dict[str, Any], List[Dict[str, Any]]]] = None
_forks = False  # the fork handler is in place


def _forget_in_child() -> None:
    """A forked process (a loader's worker) has no listener and starts none: it neither
    answers nor writes."""
    global _current, _last
    _current = _last = None
    core.on_demand.forked()


def _prune(sockets: Path) -> None:
    """Take back what processes that ended without a word (killed) left in ``sockets``."""
    for file in sockets.glob("*.json"):
        pid = file.stem
        if pid.isdigit() and started_at(int(pid)) is None:
            file.unlink(missing_ok=True)
            (sockets / f"{pid}.sock").unlink(missing_ok=True)


def current() -> Optional[Server]:
    """The server of this process, if it listens."""
    return _current


def listen(
    folder: "str | os.PathLike[str] | None" = None,
    describe: Optional[Describe] = None,
    **options: Any,
) -> Server:
    """Start this process's server (stopping one in another folder): in ``folder``, else
    ``configure(captures=...)``'s, else where this process listened last (its description
    and options too), else a new ``ic-runs/<script>-<time>``; ``describe``: what each
    capture says of the job (default: the script and its arguments); ``options``:
    :class:`Server`'s."""
    global _current, _forks, _last
    started = time.time()
    chosen = folder or core.on_demand.folder
    if _current is not None:
        if chosen is None or Path(chosen).resolve() == _current.folder.resolve():
            return _current
        stop("its folder changed")
    captures: List[Dict[str, Any]] = []
    if chosen is None and describe is None and not options and _last is not None:
        chosen, describe, options, captures = _last
    if chosen is None:
        chosen = default_folder(sys.argv[0] or "python", started)
    if not _forks:
        os.register_at_fork(after_in_child=_forget_in_child)
        atexit.register(lambda: stop("the job ended"))
        _forks = True
    server = Server(chosen, describe or _script(started), **options)
    server.captures = captures
    _current = server.start()
    _last = (server.folder, server.describe, options, captures)
    return server


def stop(reason: str = "the job ended") -> Optional[Server]:
    """Stop this process's server (see :meth:`Server.stop`); the server, or None."""
    global _current
    server, _current = _current, None
    if server is not None:
        server.stop(reason)
    return server


def switch(on: bool) -> None:
    """What the core's on demand calls to start (``on``) or stop listening: a failure to
    start is said, never raised into the training loop."""
    if not on:
        stop("on demand was turned off")
        return
    if _current is not None:
        return
    try:
        listen()
    except Exception as e:  # (from the loop's first boundary, under the environment's mode)
        logger.warning("on demand: not listening for captures: %s", e)


def _script(started: float) -> Describe:
    """A capture's description of a script of one's own: its command line."""

    def describe(capture: Dict[str, Any]) -> Dict[str, Any]:
        target = sys.argv[0] or "python"
        command = [sys.executable, *sys.argv]
        return run_meta(command, target, sys.argv[1:], started, "captured", None)

    return describe
