"""A data loader's pipeline from run.json's ``workers`` section (report/loaders.py), exactly:
each loader's split, its workers told apart by label and rank, the shares clamped, a record
saved before loaders kept their own work, and every verdict at its thresholds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from instrumented_convs.report.loaders import pipeline, verdict

TRAIN, VAL = "train at s.py:10", "val at s.py:20"
IDLE_TEXT = (
    ": the workers keep up; the wait is each batch's hand-over (its transfer from the worker) "
    "or this process's share of the loading"
)
NO_WORKERS = " (no worker processes: the batches are made in the training process)"


def _worker(label, rank, index, pid, batches, spans):
    return dict(loader=label, rank=rank, worker=index, pid=pid, batches=batches, spans=spans)


SECTION = {
    "loaders": [
        dict(label=TRAIN, rank=0, workers=2, consumed=20, wait=30, span=100, own={"collate": 10},
             copy=5, first=50, batches=25, loaders=3),
        dict(label=VAL, rank=0, workers=0, consumed=5, wait=10, span=40, own={}, copy=0),
        # rank 1's, its shares past what they can be: clamped
        dict(label=TRAIN, rank=1, workers=1, consumed=10, wait=80, span=100,
             own={"collate": 50}, copy=30),
        dict(label="never iterated", rank=0, workers=0, consumed=0, wait=0, span=10),
        dict(label="one batch", rank=0, workers=0, consumed=1, wait=150, span=100, own={},
             copy=0),  # waited longer than its pass: clamped
        dict(label="no pass timed", rank=0, workers=0, consumed=3, wait=0, span=0),
    ],
    "workers": [
        _worker(TRAIN, 0, 1, 12, 8, [[0, 0, 60, 70, True], [1, 0, 40, 45, True],
                                     [2, 0, 47, 50, True]]),  # 2nd: early, 3rd: ends at first
        _worker(TRAIN, 0, 0, 11, 6, [[0, 0, 50, 80, True]]),
        _worker(TRAIN, 0, 0, 13, 6, [[0, 0, 90, 100, True]]),  # index 0's second process
        _worker(TRAIN, 1, 0, 21, 10, [[0, 0, 0, 200, True]]),  # busier than the span
        _worker("another loader", 0, 0, 31, 4, [[0, 0, 0, 10, True]]),
    ],
}  # fmt: skip


def test_each_loader_gets_its_own_workers_split_and_verdict():
    got = pipeline(SECTION)
    labels = [(p["label"], p["rank"]) for p in got]
    assert labels == [(TRAIN, 0), (VAL, 0), (TRAIN, 1), ("one batch", 0)]
    train, val, train1, one = got
    assert train == {
        "label": TRAIN, "loaders": 3, "rank": 0, "workers": 2, "processes": 3, "consumed": 20,
        "made": 20, "wait": 0.3, "copy": 0.05, "compute": pytest.approx(0.65),
        "busy": [0.4, 0.13], "own": {"collate": 0.1}, "iteration_ms": 4e-6,
        "verdict": "data-bound: the trainer waits 30% of each iteration; 2 workers busy 26%"
        + IDLE_TEXT,
    }  # fmt: skip
    assert val == {
        "label": VAL, "loaders": 1, "rank": 0, "workers": 0, "processes": 0, "consumed": 5,
        "made": None, "wait": 0.25, "copy": 0.0, "compute": 0.75, "busy": [], "own": {},
        "iteration_ms": 8e-6,
        "verdict": "data-bound: the trainer waits 25% of each iteration" + NO_WORKERS,
    }  # fmt: skip
    assert train1 == {
        "label": TRAIN, "loaders": 1, "rank": 1, "workers": 1, "processes": 1, "consumed": 10,
        "made": 10, "wait": 0.8, "copy": pytest.approx(0.2), "compute": pytest.approx(0.0),
        "busy": [1.0], "own": {"collate": 0.5}, "iteration_ms": 1e-5,
        "verdict": "data-bound: the trainer waits 80% of each iteration; 1 worker busy 100%: "
        "most of the wait is the loader's work in this process (collate 50%)",
    }  # fmt: skip
    assert (one["wait"], one["copy"], one["compute"], one["iteration_ms"]) == (1.0, 0.0, 0.0, 1e-4)
    assert pipeline({"loaders": [], "workers": []}) == [] and pipeline({}) == []


def test_a_record_from_before_loaders_kept_their_work_reads_it_from_the_summary():
    """The loader that handed out the most batches is given the steps directly inside the
    ``data`` regions (a step's rows added up), and the ``copy`` regions outside them; any
    other loader nothing."""
    section = {
        "loaders": [
            dict(label="a", rank=None, workers=0, consumed=30, wait=20, span=100),
            dict(label="b", rank=None, workers=0, consumed=10, wait=5, span=50),
        ]
    }
    rows = [("data", 9e-8), ("data/collate", 1e-8), ("epoch/data/collate", 3e-9),
            ("epoch/data/sample", 5e-9), ("x/collate", 7e-9), ("epoch/copy", 3e-9),
            ("x/epoch/copy", 1e-9), ("data/copy", 2e-9), ("epoch/data/copy", 4e-9)]  # fmt: skip
    summary = SimpleNamespace(rows=[SimpleNamespace(name=n, total=t) for n, t in rows])
    a, b = pipeline(section, summary)

    def exact(x):
        return pytest.approx(x, rel=1e-12)

    assert a["own"] == {"collate": exact(0.13), "copy": exact(0.06), "sample": exact(0.05)}
    assert (a["wait"], a["copy"], a["compute"]) == (0.2, exact(0.04), exact(0.76))
    assert (b["own"], b["copy"], b["wait"], b["compute"]) == ({}, 0.0, 0.1, 0.9)
    assert a["verdict"] == "data-bound: the trainer waits 20% of each iteration" + NO_WORKERS
    assert b["verdict"] == "balanced: the trainer waits 10% of each iteration" + NO_WORKERS
    assert pipeline(section)[0]["own"] == {} and pipeline(section)[0]["copy"] == 0.0
    # copies longer than the pass but its wait: the rest of the pass
    copies = SimpleNamespace(rows=[SimpleNamespace(name="copy", total=9e-8)])
    assert pipeline(section, copies)[0]["copy"] == pytest.approx(0.8)


@pytest.mark.parametrize(
    "wait,busy,own,text",
    [
        (0.2, [], None, "data-bound: the trainer waits 20% of each iteration" + NO_WORKERS),
        (0.05, [0.5], None, "balanced: the trainer waits 5% of each iteration; 1 worker busy 50%"),
        (0.04, [0.1], None, "compute-bound: the trainer waits 4% of each iteration; 1 worker busy "
         "10%"),
        (0.04, [], {"a": 0.04}, "compute-bound: the trainer waits 4% of each iteration"),
        (0.3, [0.9], {"a": 0.15}, "data-bound: the trainer waits 30% of each iteration; 1 worker "
         "busy 90%: most of the wait is the loader's work in this process (a 15%)"),
        (0.3, [0.9, 0.8], {"a": 0.05, "b": 0.12}, "data-bound: the trainer waits 30% of each "
         "iteration; 2 workers busy 85%: most of the wait is the loader's work in this process "
         "(b 12%, a 5%)"),
        (0.1, [0.6, 0.4], {"a": 0.04}, "balanced: the trainer waits 10% of each iteration; 2 "
         "workers busy 50%"),
        (0.1, [0.6, 0.38], None, "balanced: the trainer waits 10% of each iteration; 2 workers "
         "busy 49%" + IDLE_TEXT),
    ],
    ids=["data-bound-at-20", "balanced-at-5", "compute-bound", "compute-bound-no-workers",
         "own-half-the-wait", "own-largest-first", "workers-half-busy", "workers-idle"],
)  # fmt: skip
def test_the_verdict_at_its_thresholds(wait, busy, own, text):
    assert verdict(wait, busy, own) == text
