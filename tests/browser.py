"""Headless Chromium for the page tests: the DOM after the scripts ran, the console, a
screenshot, and a small PNG reader to count its pixels (no imaging library needed).

Chromium is Debian's (``scripts/install_chromium.sh``). Without it the page tests skip, each
saying why, unless ``INSTRUMENTED_CONVS_EXPECT_BROWSER=1`` (set by CI) says it must be there:
then they fail. Every run is bounded by ``timeout`` and a fresh profile folder.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium() -> str:
    """The browser's path, or skip (fail under INSTRUMENTED_CONVS_EXPECT_BROWSER=1)."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get("INSTRUMENTED_CONVS_EXPECT_BROWSER") == "1":
            pytest.fail("INSTRUMENTED_CONVS_EXPECT_BROWSER=1 but chromium is not installed")
        pytest.skip("needs Debian's chromium (bash scripts/install_chromium.sh, as root)")
    return path


def _run(args: List[str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        cmd = ["timeout", "60", chromium(), *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def open_page(path: Path) -> Tuple[str, List[str]]:
    """``(DOM after the scripts ran, console messages)`` of the page at ``path``."""
    proc = _run(["--enable-logging=stderr", "--v=0", "--dump-dom", path.resolve().as_uri()])
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def screenshot(path: Path, png: Path, size: Tuple[int, int] = (1280, 900)) -> Path:
    """A screenshot of the page at ``path`` in a window of ``size`` pixels."""
    proc = _run(
        [f"--window-size={size[0]},{size[1]}", f"--screenshot={png}", path.resolve().as_uri()]
    )
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    return png


def body_data(dom: str) -> Dict[str, str]:
    """The ``data-*`` attributes of ``<body>`` in a dumped DOM."""
    m = re.search(r"<body([^>]*)>", dom)
    assert m, dom[:500]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))


def read_png(path: Path) -> Tuple[int, int, List[bytes]]:
    """``(width, height, rows)`` of an 8-bit RGB or RGBA PNG; each row is RGBA bytes."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour)
            bpp = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: List[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        prev = line
        if bpp == 3:
            rgba = bytearray()
            for i in range(0, stride, 3):
                rgba += line[i : i + 3] + b"\xff"
            rows.append(bytes(rgba))
        else:
            rows.append(bytes(line))
    return width, height, rows


def count_colour(rows: List[bytes], hex_colour: str) -> int:
    """How many pixels are exactly ``#rrggbb`` (matches on pixel boundaries only)."""
    want = bytes.fromhex(hex_colour.lstrip("#")) + b"\xff"
    n = 0
    for row in rows:
        i = row.find(want)
        while i != -1:
            if i % 4 == 0:
                n += 1
            i = row.find(want, i + 1)
    return n
