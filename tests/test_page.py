"""The page: rendered by headless Chromium, with no script error, its chart drawn to scale."""

from __future__ import annotations

import re

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import region, registry
from instrumented_convs.layers import mark_outputs, step
from instrumented_convs.report import Summary
from instrumented_convs.report.page import embed
from instrumented_convs.report.stats import merge_ranks
from instrumented_convs.testing import FakeClock, cpu_clock

from .browser import body_data, count_colour, open_page, read_png, screenshot
from .helpers import ROOT, run_script

BLUE, ORANGE, GREY = "#4e79a7", "#e07b1a", "#7f7f7f"  # page.js: depth-1 steps, regions
NASTY = "x</script><img src=q onerror=alert(1)>&amp;"


def _recorded(forward_ns=3_000_000, backward_ns=1_000_000, name="layer", calls=1):
    """A summary with exact times: a region holding a forward step and its backward, ``calls``
    times (every call alike: no spread)."""
    ic.configure(backward_every=1)
    lin = torch.nn.Linear(3, 2)
    clock = FakeClock()

    def slow(grad):
        clock.advance(backward_ns)

    with cpu_clock(clock):
        for _ in range(calls):
            with region("epoch"):
                with step(name):
                    out = mark_outputs(lin(torch.randn(4, 3)).sum())
                    clock.advance(forward_ns)
                out.grad_fn.register_prehook(lambda g: slow(g))
                out.backward()
    summary = registry.summary()
    registry.reset()
    return summary


def test_embedded_data_cannot_close_its_element_or_open_markup():
    text = embed({"k": NASTY})
    assert "<" not in text and ">" not in text and "&" not in text
    assert __import__("json").loads(text) == {"k": NASTY}


def test_a_page_draws_every_step_with_no_script_error_and_escapes_names(tmp_path):
    summary = _recorded(name=NASTY.replace("/", "|"))
    page = tmp_path / "page.html"
    page.write_text(summary.to_html(title="a <b>run</b>", meta=[("command", NASTY)]))
    text = page.read_text()
    # Self-contained: no linked script, style or font, nothing fetched from a network.
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert not re.search(r"https?://", text.replace("http://www.w3.org/2000/svg", ""))
    dom, console = open_page(page)
    assert console == []
    data = body_data(dom)
    assert data["ready"] == "1" and data["errors"] == "0"
    # One rectangle per row and one for "all": every step was drawn.
    assert re.search(r'data-rects="(\d+)"', dom).group(1) == str(len(summary.rows) + 1)
    assert "<img" not in dom and "alert(1)" in dom  # the name shown as text, never markup
    assert "a &lt;b&gt;run&lt;/b&gt;" in dom


def test_the_tools_own_row_is_in_the_table_and_not_in_the_chart(tmp_path):
    from instrumented_convs.core.frames.setup import SETUP, setup

    clock = FakeClock()
    with cpu_clock(clock):
        with region("epoch"):
            with setup():  # the tool's one-time work: 1 s, against the epoch's 3 ms
                clock.advance(1_000_000_000)
            with step("layer"):
                clock.advance(3_000_000)
    summary = registry.summary()
    assert [r.name for r in summary.rows] == ["epoch", "epoch/layer", SETUP]
    page = tmp_path / "page.html"
    page.write_text(summary.to_html(title="setup"))
    dom, console = open_page(page)
    assert console == [] and body_data(dom)["errors"] == "0"
    assert re.search(r'data-rects="(\d+)"', dom).group(1) == "3"  # "all", epoch, layer
    assert SETUP in dom  # its row of the table


def test_the_screenshot_shows_the_chart_to_scale(tmp_path):
    summary = _recorded(forward_ns=3_000_000, backward_ns=1_000_000)
    fwd = summary["epoch/layer"].total
    bwd = next(r for r in summary.rows if r.phase == "backward").total
    page = tmp_path / "page.html"
    page.write_text(summary.to_html(title="scale"))
    width, height, rows = read_png(screenshot(page, tmp_path / "shot.png", (1000, 500)))
    assert (width, height) == (1000, 500)
    assert count_colour(rows, GREY) > 5_000  # the region's band
    # The forward and backward bars side by side: on a pixel row of the band clear of text,
    # their widths are as their totals, and together as wide as the region above them.
    blue, orange = max(
        ((count_colour([r], BLUE), count_colour([r], ORANGE)) for r in rows), key=sum
    )
    assert blue / orange == pytest.approx(fwd / bwd, rel=0.02)
    region = max(count_colour([r], GREY) for r in rows)
    assert (blue + orange) / region == pytest.approx(1.0, rel=0.02)
    assert region > 0.9 * (width - 48)  # the chart spans the page (24 px margins)


def test_a_diff_page_puts_both_runs_on_one_scale_with_the_verdicts(tmp_path):
    # Three calls alike in each run (no spread): the layer's forward twice as long in b is
    # slower, the same backward unchanged, and the region holding both slower.
    a = _recorded(forward_ns=1_000_000, backward_ns=1_000_000, calls=3)
    b = _recorded(forward_ns=2_000_000, backward_ns=1_000_000, calls=3)
    result = a.diff(b)
    assert [(d.name, d.phase, d.verdict) for d in result] == [
        ("epoch", "forward", "slower"),
        ("epoch/layer", "forward", "slower"),
        ("epoch/layer", "backward", "unchanged"),
    ]
    page = tmp_path / "diff.html"
    page.write_text(result.to_html(labels=("before", "after")))
    dom, console = open_page(page)
    assert console == [] and body_data(dom)["errors"] == "0"
    assert dom.count('class="icicle"') == 2
    assert "before mean" in dom and "after mean" in dom
    shown = re.findall(r'<span class="(?:slower|faster|)">([a-z ]+)</span>', dom)
    assert shown == ["slower", "slower", "unchanged"]  # the table's verdicts, in its order
    # The screenshot: the two icicles side by side (a left, b right), one scale. On a pixel
    # row of each band clear of text, each bar is as wide as its run's total on that scale:
    # b's region spans its chart, a's is 2/3 of it, and the layer's bars are as their totals.
    width, _, rows = read_png(screenshot(page, tmp_path / "diff.png", (1000, 600)))
    half = 4 * (width // 2)  # bytes: the charts split the page in two (flex, 16 px gap)
    left, right = [r[:half] for r in rows], [r[half:] for r in rows]
    grey_a, grey_b = (max(count_colour([r], GREY) for r in side) for side in (left, right))
    (blue_a, orange_a), (blue_b, orange_b) = (
        max(((count_colour([r], BLUE), count_colour([r], ORANGE)) for r in side), key=sum)
        for side in (left, right)
    )
    total = {(r.name, r.phase): (r.total, q.total) for r, q in zip(a.rows, b.rows)}
    region_a, region_b = total[("epoch", "forward")]
    fwd_a, fwd_b = total[("epoch/layer", "forward")]
    bwd_a, bwd_b = total[("epoch/layer", "backward")]
    assert (region_a, region_b) == pytest.approx((6e-3, 9e-3))
    chart = (width - 48 - 16) / 2  # 24 px margins, the gap between the charts
    assert grey_b == pytest.approx(chart, rel=0.02)  # the longer run spans its chart
    assert grey_a / grey_b == pytest.approx(region_a / region_b, rel=0.02)
    scale = grey_b / region_b  # pixels per second, the same on both sides
    for got, want in ((blue_a, fwd_a), (blue_b, fwd_b), (orange_a, bwd_a), (orange_b, bwd_b)):
        assert got == pytest.approx(want * scale, rel=0.03)


def test_a_page_merged_over_ranks_shows_each_ranks_totals(tmp_path):
    snaps = []
    for ns in (1_000_000, 3_000_000):
        clock = FakeClock()
        with cpu_clock(clock):
            with region("epoch"):
                with step("layer"):
                    clock.advance(ns)
        snaps.append(registry.snapshot())
        registry.reset()
    merged = merge_ranks(snaps)
    page = tmp_path / "ranks.html"
    page.write_text(merged.to_html(title="two ranks"))
    dom, console = open_page(page)
    assert console == [] and body_data(dom)["errors"] == "0"
    assert "rank 0 ms" in dom and "rank 1 ms" in dom and "3.00x" in dom


def test_run_view_and_diff_write_pages_that_open(tmp_path):
    pytest.importorskip("torch_geometric")
    script = str(ROOT / "tests" / "scripts" / "plain_pyg.py")
    for out in ("a", "b"):
        run_script(
            "-m",
            "instrumented_convs",
            "run",
            "--quiet",
            "-o",
            out,
            script,
            "--epochs",
            "1",
            cwd=tmp_path,
        )
    dom, console = open_page(tmp_path / "a" / "page.html")
    assert console == [] and body_data(dom) == {"ready": "1", "errors": "0"}
    assert "plain_pyg.py" in dom and "torch " + torch.__version__ in dom
    assert Summary.load(tmp_path / "a").rows  # the page sits beside the run it shows
    run_script(
        "-m", "instrumented_convs", "view", "a", "--by", "layer", "--html", "v.html", cwd=tmp_path
    )
    run_script("-m", "instrumented_convs", "diff", "a", "b", "--html", "d.html", cwd=tmp_path)
    for name in ("v.html", "d.html"):
        dom, console = open_page(tmp_path / name)
        assert console == [] and body_data(dom)["errors"] == "0", name
    assert "conv1" in open_page(tmp_path / "v.html")[0]  # by layer: the layers' names
