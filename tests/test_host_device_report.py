"""Host and device on CUDA (issue 52): the rows' host time, device calls, lags and calls
caught up, the table's Host column, the verdict under it, and every export, from synthetic
snapshots of the three regimes (launch-bound, device-bound, mixed) and of the CPU clock."""

from __future__ import annotations

import json

import pytest

from instrumented_convs.report import Summary, Timeline, hostdevice
from instrumented_convs.report.row import FIELDS
from instrumented_convs.report.stats import EntryStats, merge_ranks, summarize

from .browser import body_data, open_page

MS = 1_000_000  # ns
NEW = ("host", "device_calls", "lag", "caught")
SNAPSHOT_NEW = ("host", "dcalls", "lag", "caught")


def _entry(name, path, scope, depth, parent, calls, total, kind="step", **more):
    """An EntryStats of ``calls`` calls of equal time adding up to ``total`` ns."""
    each = total // calls
    return EntryStats(
        name=name,
        path=path,
        scope=scope,
        kind=kind,
        depth=depth,
        parent=parent,
        count=calls,
        total=total,
        sumsq=each * each * calls,
        min=each,
        max=each,
        errors=0,
        untimed=0,
        **more,
    )


def _device(calls, host, lag_each, caught):
    """The host and device fields of ``calls`` calls timed on the device."""
    return {"host": host, "dcalls": calls, "lag": lag_each * calls, "caught": caught}


# launch-bound: the host took about the device's time, lags small, every call caught up
LAUNCH = [
    _entry("forward", "forward", None, 0, -1, 10, 20 * MS, "region", **_device(10, 19 * MS, 0, 10)),
    _entry(
        "GCNConv", "forward/GCNConv", "convs.0", 1, 0, 10, 18 * MS, **_device(10, 17 * MS, 0, 10)
    ),
    _entry(
        "lin",
        "forward/GCNConv/lin",
        "convs.0",
        2,
        1,
        10,
        6 * MS,
        **_device(10, 5 * MS, 10_000, 10),
    ),
]
# device-bound: the host ran 3 ms ahead, no call caught up, host time a small part
DEVICE = [
    _entry(
        "backward", "backward", None, 0, -1, 10, 40 * MS, "region", **_device(10, 2 * MS, 3 * MS, 0)
    ),
    _entry(
        "GCNConv",
        "backward/GCNConv",
        "convs.1",
        1,
        0,
        10,
        38 * MS,
        **_device(10, MS, 3 * MS, 0),
    ),
]
# mixed: half the calls caught up
MIXED = [
    _entry("loss", "loss", None, 0, -1, 10, 4 * MS, "region", **_device(10, MS, 400_000, 5)),
]
# on the CPU clock: no device calls
CPU = [
    _entry("forward", "forward", None, 0, -1, 4, 8 * MS, "region"),
    _entry("lin", "forward/lin", None, 1, 0, 4, 2 * MS),
]


def _both(*parts):
    """One snapshot of several, their parents' indices shifted."""
    out = []
    for part in parts:
        offset = len(out)
        out += [s._replace(parent=s.parent + offset) if s.parent >= 0 else s for s in part]
    return out


def _section(table: str):
    """The lines of the host and device section under a table (empty: none)."""
    lines = table.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Host and device")]
    return lines[starts[0] :] if starts else []


def test_rows_carry_the_host_time_device_calls_lags_and_calls_caught_up():
    s = summarize(_both(LAUNCH, DEVICE, MIXED))
    fwd, back, loss = s["forward"], s["backward"], s["loss"]
    assert (fwd.host, fwd.device_calls, fwd.lag, fwd.caught) == (0.019, 10, 0.0, 10)
    assert back.host == pytest.approx(0.002) and back.lag == pytest.approx(0.030)
    assert (back.device_calls, back.caught) == (10, 0)
    assert s["forward/GCNConv/lin"].lag == pytest.approx(1e-4)  # inclusive, not its children's
    assert s["forward/GCNConv"].lag == 0.0
    assert (loss.device_calls, loss.caught) == (10, 5)
    # merged over ranks (and layer instances): added up
    merged = merge_ranks([LAUNCH, LAUNCH])
    assert (merged["forward"].host, merged["forward"].device_calls) == (0.038, 20)
    # a sampled stratum: scaled by its weight like total
    weighted = summarize([s._replace(weight=3.0) for s in MIXED])
    assert weighted["loss"].host == pytest.approx(0.003)
    assert (weighted["loss"].device_calls, weighted["loss"].caught) == (30, 15)
    assert weighted["loss"].lag == pytest.approx(0.012)


def test_the_verdict_of_each_regime():
    s = summarize(_both(LAUNCH, DEVICE, MIXED))
    regions = {p.name: p for p in hostdevice.parts(s)["regions"]}
    assert [regions[n].verdict for n in ("forward", "backward", "loss")] == [
        "launch-bound",
        "device-bound",
        "mixed",
    ]
    assert regions["forward"].share == pytest.approx(0.95)
    assert regions["backward"].mean_lag == pytest.approx(0.003)
    assert regions["loss"].caught_share == 0.5
    # the thresholds decide: a caught-up share of exactly 0.8 is launch-bound, 0.2 device-bound
    edge = summarize([MIXED[0]._replace(caught=8)])
    assert hostdevice.parts(edge)["regions"][0].verdict == "launch-bound"
    edge = summarize([MIXED[0]._replace(caught=2)])
    assert hostdevice.parts(edge)["regions"][0].verdict == "device-bound"
    # the steps named: host at least half their device time, the largest device times first
    steps = hostdevice.parts(s)["steps"]
    assert [p.name for p in steps] == ["forward/GCNConv", "forward/GCNConv/lin"]
    assert steps[1].share == pytest.approx(5 / 6)


def test_the_table_shows_the_host_column_and_the_verdict():
    s = summarize(_both(LAUNCH, DEVICE, MIXED))
    table = str(s)
    header = [h.strip() for h in table.splitlines()[1].split("|")]
    assert header[header.index("Total") + 1] == "Host"
    line = next(x for x in table.splitlines() if x.startswith("- backward"))
    cells = [c.strip() for c in line.split("|")]
    assert cells[header.index("Host")] == "2.000"  # in the table's unit (ms)
    assert any(x.startswith("Host: the CPU's time") for x in table.splitlines())
    assert _section(table) == [
        "Host and device (calls timed with CUDA events; docs/host_device.md):",
        "  forward: launch-bound, the device waited for the host: host 19 ms of 20 ms device, "
        "95% (10 of 10 calls caught up)",
        "  backward: device-bound, the host ran ahead of the device: host 3 ms ahead on "
        "average (0 of 10 calls caught up)",
        "  loss: mixed: 50% of 10 calls caught up, host 400 us ahead on average",
        "  host time most of the device time: forward/GCNConv 94%, forward/GCNConv/lin 83%",
    ]


def test_where_some_calls_lags_were_read_host_time_is_estimated_for_all():
    """40 calls, the host time and lag of 10 read (a step's first 32 on CUDA, then one in
    8): the Host column and the verdict's host time are those 10's mean times 40."""
    partial = [
        _entry(
            "forward", "forward", None, 0, -1, 40, 20 * MS, "region", **_device(10, 4 * MS, 0, 10)
        )
    ]
    s = summarize(partial)
    table = str(s)
    header = [h.strip() for h in table.splitlines()[1].split("|")]
    cells = [
        c.strip()
        for c in next(x for x in table.splitlines() if x.startswith("- forward")).split("|")
    ]
    assert cells[header.index("Host")] == "16000.000"  # (the table in us)
    part = hostdevice.parts(s)["regions"][0]
    assert (part.host, part.device, part.calls, part.count) == (
        pytest.approx(0.016),
        pytest.approx(0.02),
        10,
        40,
    )
    assert _section(table)[1] == (
        "  forward: launch-bound, the device waited for the host: host 16 ms of 20 ms device, "
        "80% (10 of 10 calls caught up; lags read for 10 of 40 calls)"
    )


def test_by_layer_each_layer_has_its_verdict():
    s = summarize(_both(LAUNCH, DEVICE), by="layer")
    layers = {p.name: p for p in hostdevice.parts(s)["layers"]}
    assert set(layers) == {"convs.0", "convs.1"}
    assert layers["convs.0"].host == pytest.approx(0.017)  # its own row, not lin's again
    assert (layers["convs.0"].verdict, layers["convs.1"].verdict) == (
        "launch-bound",
        "device-bound",
    )
    section = _section(str(s))
    assert any(x.startswith("  layer convs.1: device-bound") for x in section)
    assert "(convs.0)" in section[-1]
    # by step, no layer lines
    assert not hostdevice.parts(summarize(LAUNCH))["layers"]


def test_a_cpu_summary_has_neither_the_column_nor_the_verdict():
    s = summarize(CPU)
    table = str(s)
    assert "Host" not in table.splitlines()[1] and not _section(table)
    assert s.host_device() is None and "host_device" not in s.to_dict()
    assert "Host and device" not in s.to_html()
    # a CPU row beside device rows: a blank Host cell
    mixed = summarize(_both(CPU, DEVICE))
    line = next(x for x in str(mixed).splitlines() if x.startswith("- forward"))
    header = [h.strip() for h in str(mixed).splitlines()[1].split("|")]
    assert [c.strip() for c in line.split("|")][header.index("Host")] == ""


def test_json_csv_and_pandas_round_trip_the_fields_and_json_has_the_verdict():
    s = summarize(_both(LAUNCH, DEVICE, MIXED))
    assert set(NEW) <= set(FIELDS)
    data = json.loads(s.to_json())
    assert data["rows"][0]["host"] == 0.019 and data["rows"][0]["device_calls"] == 10
    verdict = data["host_device"]
    assert [p["verdict"] for p in verdict["regions"]] == ["launch-bound", "device-bound", "mixed"]
    assert verdict == json.loads(json.dumps(s.host_device()))
    assert Summary.from_json(s.to_json()) == s
    back = Summary.from_csv(s.to_csv(), total=s.total)
    assert [[getattr(r, k) for k in NEW] for r in back] == [[getattr(r, k) for k in NEW] for r in s]
    frame = s.to_dataframe()
    assert set(NEW) <= set(frame.columns)
    assert Summary.from_dataframe(frame, total=s.total) == s


def test_summaries_saved_without_the_fields_still_load():
    s = summarize(_both(LAUNCH, DEVICE))
    data = s.to_dict()
    del data["host_device"]
    for row in data["rows"]:
        for k in NEW:
            del row[k]
    old = Summary.from_dict(data)
    assert [r.name for r in old] == [r.name for r in s]
    assert all(getattr(r, k) == 0 for r in old for k in NEW)
    assert old.host_device() is None and not _section(str(old))
    lines = s.to_csv().splitlines()
    header = lines[0].split(",")
    keep = [j for j, name in enumerate(header) if name not in NEW]
    stripped = "\n".join(",".join(line.split(",")[j] for j in keep) for line in lines)
    assert all(r.device_calls == 0 for r in Summary.from_csv(stripped + "\n"))
    old_df = Summary.from_dataframe(s.to_dataframe().drop(columns=list(NEW)))
    assert len(old_df) == len(s) and all(r.host == 0.0 for r in old_df)


def test_a_run_saved_without_the_fields_still_loads(tmp_path):
    from instrumented_convs.commands.launch.runs import load, saved_summary, write_run

    path = write_run(tmp_path / "run", _both(LAUNCH, DEVICE), {"exit_code": 0})
    data = json.loads(path.read_text())
    snap = data["snapshots"][0]
    assert set(SNAPSHOT_NEW) <= set(snap["fields"])
    keep = [j for j, name in enumerate(snap["fields"]) if name not in SNAPSHOT_NEW]
    snap["fields"] = [snap["fields"][j] for j in keep]
    snap["entries"] = [[e[j] for j in keep] for e in snap["entries"]]
    for row in data["summary"]["rows"]:
        for k in NEW:
            del row[k]
    del data["summary"]["host_device"]
    path.write_text(json.dumps(data))
    again = saved_summary(load(tmp_path / "run"))
    assert [r.name for r in again] == [
        "forward",
        "forward/GCNConv",
        "forward/GCNConv/lin",
        "backward",
        "backward/GCNConv",
    ]
    assert all(r.device_calls == 0 and r.host == 0.0 for r in again)
    assert all(r.lag == 0.0 for r in Summary.load(tmp_path / "run"))


def test_the_page_shows_host_time_and_the_verdict(tmp_path):
    s = summarize(_both(LAUNCH, DEVICE, MIXED))
    html = s.to_html()
    assert "Host and device (calls timed with CUDA events" in html
    assert '"host": 0.019' in html and '"device_calls": 10' in html
    assert "Host (ms)" in html  # the table's column, in the page's table too
    page = tmp_path / "page.html"
    page.write_text(html)
    dom, console = open_page(page)  # drawn by the script, with no error
    assert console == [] and body_data(dom)["errors"] == "0"
    assert "<h2>Host and device (calls timed with CUDA events; docs/host_device.md)</h2>" in dom
    assert "backward: device-bound, the host ran ahead of the device" in dom


def test_the_trace_gives_each_cuda_slice_the_other_clocks_duration():
    calls = [
        ("lin", "lin", None, "step", "forward", 1_000, 3_000, 9, -1, (1_500, 11_500)),
        ("cpu", "cpu", None, "step", "forward", 4_000, 5_000, 9, -1, None),
    ]
    snapshot = {
        "calls": calls,
        "limit": 10,
        "recording": False,
        "truncated": None,
        "main_thread": 9,
        "wall_offset_ns": 0,
    }
    events = [e for e in Timeline(snapshot).to_chrome(pid=0)["traceEvents"] if e["ph"] == "X"]
    on_cpu = {e["name"]: e["args"] for e in events if e["cat"] == "forward"}
    on_gpu = {e["name"]: e["args"] for e in events if e["cat"] == "forward,gpu"}
    assert on_cpu["lin"]["device_us"] == 10.0 and "device_us" not in on_cpu["cpu"]
    assert on_gpu["lin"]["host_us"] == 2.0 and set(on_gpu) == {"lin"}


def test_steps_by_relation_are_named_with_their_relation():
    """A summary by relation names each host-heavy step with its relation (by step, the
    relations' rows are one)."""
    heavy = _device(10, 18 * MS, 0, 10)  # host about the device's time: named
    snap = [
        _entry("forward", "forward", None, 0, -1, 10, 40 * MS, "region", **_device(10, 1, 0, 10)),
        _entry("SAGEConv", "forward/SAGEConv", "c.a", 1, 0, 10, 19 * MS, relation="a", **heavy),
        _entry("SAGEConv", "forward/SAGEConv", "c.b", 1, 0, 10, 19 * MS, relation="b", **heavy),
    ]
    names = {p.name for p in hostdevice.parts(summarize(snap, by="relation"))["steps"]}
    assert names == {"forward/SAGEConv (a)", "forward/SAGEConv (b)"}
    assert {p.name for p in hostdevice.parts(summarize(snap))["steps"]} == {"forward/SAGEConv"}
    assert hostdevice.parts(summarize(snap, by="relation"))["layers"] == []  # (by layer only)


def test_the_json_of_the_three_regimes_by_layer_field_by_field():
    """Every part's fields as plain data, exactly (the verdict's inputs and what it derives),
    and the thresholds; a layer's part is its outermost rows of its scope."""
    s = summarize(_both(LAUNCH, DEVICE, MIXED), by="layer")
    got = s.host_device()

    def part(name, what, host, device, lag, caught, verdict):
        return {
            "name": name,
            "what": what,
            "host": pytest.approx(host),
            "device": pytest.approx(device),
            "calls": 10,
            "lag": pytest.approx(lag),
            "caught": caught,
            "count": 10,
            "verdict": verdict,
            "share": pytest.approx(host / device),
            "caught_share": caught / 10,
            "mean_lag": pytest.approx(lag / 10),
        }

    assert got["regions"] == [
        part("forward", "region", 0.019, 0.020, 0.0, 10, "launch-bound"),
        part("backward", "region", 0.002, 0.040, 0.030, 0, "device-bound"),
        part("loss", "region", 0.001, 0.004, 0.004, 5, "mixed"),
    ]
    assert got["layers"] == [
        part("convs.0", "layer", 0.017, 0.018, 0.0, 10, "launch-bound"),
        part("convs.1", "layer", 0.001, 0.038, 0.030, 0, "device-bound"),
    ]
    assert got["steps"] == [
        part("forward/GCNConv (convs.0)", "step", 0.017, 0.018, 0.0, 10, "launch-bound"),
        part("forward/GCNConv/lin (convs.0)", "step", 0.005, 0.006, 1e-4, 10, "launch-bound"),
    ]
    assert got["thresholds"] == {"launch_bound": 0.8, "device_bound": 0.2, "host_heavy": 0.5}


def test_a_backward_step_is_marked_and_rows_without_regions_are_the_parts():
    """No region: the top-level rows are the parts; a backward row is named with its mark;
    a mixed part whose lags were read for some calls says so."""
    snap = [
        _entry("GCNConv", "GCNConv", "conv", 0, -1, 40, 8 * MS, phase="backward",
               **_device(10, 7 * MS, 100_000, 5)),
        _entry("lin", "GCNConv/lin", "conv", 1, 0, 40, 4 * MS, phase="backward",
               **_device(10, 3 * MS, 0, 10)),
    ]  # fmt: skip
    s = summarize(snap)
    found = hostdevice.parts(s)
    assert [(p.name, p.what) for p in found["regions"]] == [("GCNConv [backward]", "step")]
    assert [p.name for p in found["steps"]] == ["GCNConv [backward]", "GCNConv/lin [backward]"]
    assert found["layers"] == []
    assert _section(str(s)) == [
        "Host and device (calls timed with CUDA events; docs/host_device.md):",
        "  GCNConv [backward]: mixed: 50% of 10 calls caught up, host 100 us ahead on average "
        "(lags read for 10 of 40 calls)",
        "  host time most of the device time: GCNConv [backward] 350%, GCNConv/lin [backward] 300%",
    ]


def test_regions_are_the_parts_beside_a_top_level_step_and_the_thresholds_are_inclusive():
    """A step outside any region is not a region's part; a step whose host time is exactly
    half its device time is named; 7 of 10 calls caught up reads 70%."""
    snap = [
        _entry("epoch", "epoch", None, 0, -1, 10, 10 * MS, "region", **_device(10, MS, 0, 7)),
        _entry("lin", "lin", None, 0, -1, 10, 4 * MS, **_device(10, 2 * MS, 0, 10)),
    ]
    s = summarize(snap)
    found = hostdevice.parts(s)
    assert [p.name for p in found["regions"]] == ["epoch"]
    assert [(p.name, p.share) for p in found["steps"]] == [("lin", 0.5)]
    assert (
        _section(str(s))[1]
        == "  epoch: mixed: 70% of 10 calls caught up, host 0 ns ahead on average"
    )
