"""The tests' Python children, forked from one process that has imported torch already.

Most tests that start a child run ``python [-W ...] (-m MOD | -c CODE | SCRIPT) ARGS`` and
each child spent about 2 s of CPU importing torch before its own work: hundreds of children
a suite. A server (this file run as a script, one per pytest process and interpreter) imports
torch once and forks a child per request, which then becomes what the interpreter would have
been: its environment, directory, ``sys.argv``, ``sys.path`` (the script's folder or the
directory, then ``PYTHONPATH``, then the interpreter's own), warning filters, standard streams
(files), ``__main__``, and at the end its threads joined, ``atexit`` run, its exit status or
death by SIGINT as Python's. Our package and PyG are never preloaded (the tests watch their
imports). :func:`run` declines (None: the caller starts a real interpreter) where the fork
could differ: another option than ``-W``, an environment variable that differs and may be read
at torch's import, a ``PYTHONPATH`` entry that holds a module the server imported, or
``INSTRUMENTED_CONVS_TESTS_FORK=0``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from typing import Dict, List, Optional, Sequence

#: Variables whose values may differ from the server's: read after torch's import, if at all
#: (ours, pytest's, DGL's, Lightning's: its seed_everything sets PL_GLOBAL_SEED in pytest).
FREE = ("PYTHONPATH", "DGLBACKEND", "INSTRUMENTED_CONVS_", "PYTEST_", "PL_")


def _moved(a: Dict[str, str], b: Dict[str, str]) -> List[str]:
    """The variables set differently in ``a`` and ``b`` that torch's import may read."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and not k.startswith(FREE))


def _parse(argv: Sequence[str]) -> Optional[Dict[str, object]]:
    """``python``'s arguments as a request: ``-W`` options, then one of ``-m MOD``, ``-c
    CODE``, ``SCRIPT``, then the program's; None for anything else."""
    warn: List[str] = []
    i = 0
    while i < len(argv) and argv[i] == "-W" and i + 1 < len(argv):
        warn.append(argv[i + 1])
        i += 2
    rest = list(argv[i:])
    if not rest:
        return None
    if rest[0] in ("-m", "-c") and len(rest) > 1:
        return {"warn": warn, "kind": rest[0], "target": rest[1], "args": rest[2:]}
    if rest[0].startswith("-"):
        return None
    return {"warn": warn, "kind": "script", "target": rest[0], "args": rest[1:]}


class _Server:
    """The running server of one interpreter: its pipes and what it had imported."""

    def __init__(self, python: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env = env
        # killed with its parent only where that is the main thread: Linux ties it to the
        # thread that started it, and another thread of pytest's may end before pytest
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            [python, __file__, *(["--die-with-parent"] if main else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        hello = json.loads(self.proc.stdout.readline())
        self.modules = set(hello["modules"])
        self.lock = threading.Lock()

    def shadows(self, path: str) -> bool:
        """Whether a ``PYTHONPATH`` holds a top-level module the server has imported."""
        for folder in filter(None, path.split(os.pathsep)):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                stem = name.split(".")[0] if not name.endswith(".dist-info") else ""
                if stem in self.modules:
                    return True
        return False


_servers: Dict[str, Optional[_Server]] = {}


def _server() -> Optional[_Server]:
    """This interpreter's server, started at the first request (None where it cannot be);
    started anew where it ended or pytest's own environment has changed since (a test that
    set a variable and left it)."""
    known = _servers.get(sys.executable)
    if known is not None and known.lock.acquire(blocking=False):
        try:
            now = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            if known.proc.poll() is not None or _moved(now, known.env):
                known.proc.stdin.close()  # (it ends at the end of its input)
                known.proc.wait(60)
                del _servers[sys.executable]
        finally:
            known.lock.release()
    if sys.executable not in _servers:
        try:
            _servers[sys.executable] = _Server(sys.executable)
        except (OSError, ValueError):
            _servers[sys.executable] = None
    return _servers[sys.executable]


class Child:
    """A forked child under way: its ``pid``, its output files, :meth:`wait`."""

    def __init__(self, server: _Server, argv: Sequence[str], pid: int, tmp: str) -> None:
        self.server, self.argv, self.pid, self._tmp = server, list(argv), pid, tmp
        self.out, self.err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        self.returncode: Optional[int] = None

    def wait(self, timeout: float) -> "subprocess.CompletedProcess[str]":
        """Its end: the completed process; :class:`subprocess.TimeoutExpired` after killing
        it where it ran past ``timeout`` seconds, as :func:`subprocess.run` does."""
        expired: List[bool] = []
        timer = threading.Timer(timeout, lambda: expired.append(True) or _kill(self.pid))
        timer.start()
        try:
            self.returncode = json.loads(self.server.proc.stdout.readline())["status"]
        finally:
            timer.cancel()
            self.server.lock.release()
        with open(self.out) as f, open(self.err) as g:
            stdout, stderr = f.read(), g.read()
        for name in (self.out, self.err):
            os.unlink(name)
        os.rmdir(self._tmp)
        args = [sys.executable, *self.argv]
        if expired:
            raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
        return subprocess.CompletedProcess(args, self.returncode, stdout, stderr)


def start(
    argv: Sequence[str], env: Dict[str, str], cwd: str, session: bool = False
) -> Optional[Child]:
    """``python *argv`` forked and under way (see the module; ``session``: in a session and
    process group of its own), or None where a real interpreter must run it. Until its
    :meth:`Child.wait`, the server forks no other."""
    request = _parse(argv)
    if request is None or os.environ.get("INSTRUMENTED_CONVS_TESTS_FORK") == "0":
        return _declined(argv, "an option or turned off")
    server = _server()
    if server is None or not server.lock.acquire(blocking=False):
        return _declined(argv, "no server free")
    moved = _moved(env, server.env)
    why = f"variables {moved}" if moved else None
    if why is None and server.shadows(env.get("PYTHONPATH", "")):
        why = "PYTHONPATH shadows an import"
    if why is not None:
        server.lock.release()
        return _declined(argv, why)
    tmp = tempfile.mkdtemp(prefix="forked-")
    for name in ("out", "err"):  # there from the start, for a caller that reads as it goes
        open(os.path.join(tmp, name), "w").close()
    request.update(env=env, cwd=str(cwd), out=os.path.join(tmp, "out"))
    request.update(err=os.path.join(tmp, "err"), session=session)
    server.proc.stdin.write(json.dumps(request) + "\n")
    server.proc.stdin.flush()
    pid = json.loads(server.proc.stdout.readline())["pid"]
    return Child(server, argv, pid, tmp)


def run(
    argv: Sequence[str], env: Dict[str, str], cwd: str, timeout: float
) -> "Optional[subprocess.CompletedProcess[str]]":
    """``python *argv`` as a forked child, to its end: the completed process, or None where
    a real interpreter must run it (:func:`start`, :meth:`Child.wait`)."""
    child = start(argv, env, cwd)
    return None if child is None else child.wait(timeout)


def _declined(argv: Sequence[str], why: str) -> None:
    """None, and a line naming the child and why in ``$INSTRUMENTED_CONVS_TESTS_FORK_LOG``."""
    log = os.environ.get("INSTRUMENTED_CONVS_TESTS_FORK_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{why}: {' '.join(argv)[:200]!r}\n")
    return None


def _kill(pid: int) -> None:
    """End a child that ran out of time, as :func:`subprocess.run` does."""
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the server: this file run as a script ---------------------------------------------------


def _become(request: Dict[str, object], base_path: List[str], filters: list) -> None:
    """In the forked child: turn into ``python`` given the request, run it, never return."""
    import atexit
    import signal
    import traceback
    import types
    import warnings

    _die_with_parent()
    env = request["env"]
    if request["session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        new = os.open(path, flags, 0o644)
        os.dup2(new, fd)
        os.close(new)
    kind, target, args = request["kind"], request["target"], request["args"]
    if kind == "-m":
        first, argv0 = os.getcwd(), target
    elif kind == "-c":
        first, argv0 = "", "-c"
    else:
        first, argv0 = os.path.dirname(os.path.abspath(target)), target
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *dict.fromkeys([*extra, *base_path])]  # once each, as site leaves it
    sys.path_importer_cache.clear()
    sys.argv[:] = [argv0, *args]
    warnings.filters[:] = filters
    sys.warnoptions[:] = []
    options = [w for w in env.get("PYTHONWARNINGS", "").split(",") if w] + request["warn"]
    sys.warnoptions.extend(options)
    warnings._processoptions(options)  # type: ignore[attr-defined]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    code, interrupted = 0, False
    try:
        if kind == "-m":
            import runpy

            runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]
        else:
            if kind == "-c":
                source, name = target, "<string>"
            else:
                import tokenize

                with tokenize.open(target) as f:
                    source, name = f.read(), target
                main.__file__ = target
            main.__dict__["__cached__"] = None
            exec(compile(source, name, "exec"), main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 130, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def _die_with_parent() -> None:
    """Linux: be killed when the process that started this one ends (a pytest killed mid-run
    leaves no server, and the server no child, that runs on)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exit_code(value: object) -> int:
    """The exit status of ``SystemExit(value)``, as the interpreter makes it."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _serve() -> None:
    """Import torch, say so, then fork a child per request line until the input ends."""
    import warnings

    if "--die-with-parent" in sys.argv:
        _die_with_parent()
    filters = list(warnings.filters)
    here = os.path.dirname(os.path.abspath(__file__))
    base_path = [p for p in sys.path if p and os.path.abspath(p) != here]
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    import torch  # noqa: F401  (what each child would import first)

    modules = sorted({m.split(".")[0] for m in sys.modules})
    replies.write(json.dumps({"modules": modules}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            _become(request, base_path, filters)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        replies.write(json.dumps({"status": status}) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
