"""A capture's folder, written in a process of its own: the job's interpreter is its training
loop's, and a thread rendering JSON, the page and the trace there takes the interpreter's
lock each time a torch op lets go of it (the loop's iterations ran several times slower
while one wrote: docs/performance.md, "On demand").

The job hands over what it recorded as plain data (its snapshot, its timeline, what the
capture's run.json says of it), pickled into the capture's folder; a child interpreter,
with no GPU, writes ``run.json`` (or ``rank<N>.json``) and every renderer's file, and rank
0's merges the ranks' files once they are all there (at the job's own priority: a lower one
starved it where the machine was busy, and the capture waited). Where no child can be
started, the job writes the folder itself.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

from .runs import merge_folder, write_run

__all__ = ["write_capture", "render", "main"]

logger = logging.getLogger(__name__)

#: What a child is told of the job's environment: nothing recorded, no GPU, one thread.
_CHILD_ENV = {
    "INSTRUMENTED_CONVS_DISABLE": "1",
    "CUDA_VISIBLE_DEVICES": "",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


def render(raw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Write a capture's folder from its raw data (``folder``, ``snapshot``, ``meta``,
    ``job``, ``timeline``, ``trace_name``; ``merge``: the world size, for rank 0, with
    ``merge_timeout``; no ``snapshot``: the merge alone); what the merge left out, for rank
    0, else None."""
    folder = Path(raw["folder"])
    if raw["snapshot"] is not None:  # (None: rank 0 missed the capture, and merges the rest)
        write_run(
            folder,
            raw["snapshot"],
            raw["meta"],
            job=tuple(raw["job"]),
            timeline=raw["timeline"],
            trace_name=raw["trace_name"],
        )
    world = raw.get("merge")
    if not world:
        return None
    deadline = time.monotonic() + raw.get("merge_timeout", 60.0)
    while time.monotonic() < deadline:  # every rank's file, or its word that it missed it
        told = [
            r
            for r in range(world)
            if (folder / f"rank{r}.json").exists() or (folder / f"rank{r}.missed").exists()
        ]
        if len(told) == world:
            break
        time.sleep(0.05)
    return {"ranks_missing": merge_folder(folder)["ranks_missing"]}


def write_capture(raw: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Write a capture's folder in a child interpreter (the job's own where none starts);
    :func:`render`'s answer."""
    folder = Path(raw["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f".capture.{os.getpid()}.pickle"
    data.write_bytes(pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL))
    env = {k: v for k, v in os.environ.items() if k != "INSTRUMENTED_CONVS_RECORD"}
    env.update(_CHILD_ENV, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = f"import sys; from {__name__} import main; sys.exit(main(sys.argv[1]))"
    child = None
    try:
        child = subprocess.run(
            [sys.executable, "-c", code, str(data)], env=env, capture_output=True, text=True
        )
        why = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
    except OSError as e:
        why = str(e)
    try:
        if child is not None and child.returncode == 0:
            return json.loads(child.stdout.strip().splitlines()[-1])
        logger.warning("on demand: the capture's writer did not run (%s): written here", why)
        return render(raw)
    finally:
        data.unlink(missing_ok=True)


def main(path: str) -> int:
    """A child's work: the raw data at ``path`` written as its folder; prints the answer."""
    raw = pickle.loads(Path(path).read_bytes())
    print(json.dumps(render(raw)))
    return 0
