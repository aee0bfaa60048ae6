"""Render README.md as GitHub shows it, roughly, and screenshot its first screen.

    PYTHONPATH=. MAIN/bin/python scripts/readme_shot.py     # -> docs/readme_first_screen.png

README's picture, docs/run_page_icicle.png, is first cut from docs/run_page.png (the icicle
band; Pillow, which matplotlib brings). The markdown is rendered by markdown-it-py (in the
main environment) with tables on, into a page with GitHub-like CSS inline and README's
relative pictures resolved against the repository; Debian's headless chromium (bounded by
``timeout``, a fresh profile) takes a 1280x900 screenshot of its top: what a visitor sees
first.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CSS = """
body { margin: 0; background: #fff; color: #1f2328;
  font: 16px/1.5 -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; }
.markdown-body { box-sizing: border-box; max-width: 980px; margin: 0 auto; padding: 32px 45px; }
h1, h2 { border-bottom: 1px solid #d1d9e0; padding-bottom: .3em; font-weight: 600; }
h1 { font-size: 2em; margin: 0 0 16px; } h2 { font-size: 1.5em; margin: 24px 0 16px; }
p, pre, table, ul { margin: 0 0 16px; }
a { color: #0969da; text-decoration: none; }
code { font: 85%/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  background: rgba(129, 139, 152, .12); border-radius: 6px; padding: .2em .4em; }
pre { background: #f6f8fa; border-radius: 6px; padding: 16px; overflow: auto; }
pre code { background: none; padding: 0; font-size: 85%; }
img { max-width: 100%; border: 1px solid #d1d9e0; }
table { border-collapse: collapse; } th, td { border: 1px solid #d1d9e0; padding: 6px 13px; }
"""


def icicle(page_png: Path, out: Path, rows: tuple = (200, 395)) -> Path:
    """README's picture: the band of docs/run_page.png that holds the icicle (its legend and
    the forward and backward steps per layer), so that install shows on the first screen."""
    from PIL import Image

    with Image.open(page_png) as im:
        im.crop((0, rows[0], im.width, rows[1])).save(out, optimize=True)
    return out


def render(markdown: str) -> str:
    """README's HTML body (CommonMark with tables, as GitHub renders the parts README uses)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").render(markdown)


def page(readme: Path) -> str:
    """A standalone page of ``readme``, its relative links resolved against its folder."""
    body = render(readme.read_text())
    base = readme.parent.resolve().as_uri() + "/"
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><base href="{base}">'
        f"<title>README</title><style>{CSS}</style></head>"
        f'<body><article class="markdown-body">{body}</article></body></html>'
    )


def screenshot(html: Path, png: Path, width: int, height: int) -> None:
    """Headless chromium's screenshot of ``html`` in a window of ``width`` x ``height``."""
    browser = shutil.which("chromium")
    if browser is None:
        sys.exit("needs Debian's chromium (bash scripts/install_chromium.sh, as root)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [
            "timeout",
            "60",
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            html.resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if proc.returncode != 0 or not png.exists():
        sys.exit(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "readme_first_screen.png")
    ap.add_argument("--size", default="1280x900", help="the window, WIDTHxHEIGHT (1280x900)")
    ap.add_argument("--html", type=Path, help="also keep the rendered page here")
    ap.add_argument(
        "--no-icicle", action="store_true", help="keep docs/run_page_icicle.png as it is"
    )
    args = ap.parse_args()
    if not args.no_icicle:
        print(icicle(ROOT / "docs" / "run_page.png", ROOT / "docs" / "run_page_icicle.png"))
    width, height = (int(v) for v in args.size.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        html = args.html or Path(tmp) / "README.html"
        html.write_text(page(args.readme))
        args.out.unlink(missing_ok=True)
        screenshot(html, args.out, width, height)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
