"""`advise` (and the findings `report` shares) is linear in the number of measurements.

A document of 3,000 measurements took 68 s when advice looked up, for every point, every other
measurement (lengths per point, tried configurations per point, the earlier run's figure by a
scan, the most common length by list.count). The check is not a wall-clock margin: the same
document shape at 750 and at 3,000 measurements (4x) is advised, and both the number of Python
function calls (deterministic) and the CPU time of this process (time.process_time, not wall
time: other processes' load does not count) must grow by far less than the 16x a quadratic part
gives. History runs of the same size are given too, so their lookup is covered."""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

from gpubox.bench.report.advice import advise
from gpubox.bench.report.data import from_doc

SEED = Path(__file__).resolve().parent.parent / "fixtures" / "results" / "seed-after.json"


def _doc(n: int) -> dict:
    d = json.loads(SEED.read_text())
    base, out = d["measurements"], []
    for i in range(n):
        m = copy.deepcopy(base[i % len(base)])
        m["key"] = f"{m['key']}/x{i}"
        m["output_len"] = (m.get("output_len") or 256) + i  # a point per measurement: the worst case
        m["label"] = f"{m['label']}-{i % 97}"  # many configurations: many winners
        if m.get("tok_s"):
            m["tok_s"] = round(m["tok_s"] * (1 + (i * 7919 % 100) / 10000), 3)
        out.append(m)
    d["measurements"] = out
    return d


def _cost(n: int) -> tuple[int, float]:
    run = from_doc(_doc(n), f"<{n}>", "run")
    hist = [from_doc(dict(_doc(n), run_id=f"h{k}"), f"<h{k}>", "history") for k in range(3)]
    for h in hist:
        h.doc["verdict"] = {"status": "healthy", "reasons": []}
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    t0 = time.process_time()
    sys.setprofile(count)
    try:
        advise(run, hist)
    finally:
        sys.setprofile(None)
    return calls, time.process_time() - t0


def test_advise_is_linear_in_the_measurements():
    _cost(100)  # warm caches and imports
    small_calls, small_cpu = _cost(750)
    big_calls, big_cpu = _cost(3000)
    assert big_calls / small_calls < 6, (small_calls, big_calls)  # linear: about 4; quadratic: 16
    assert big_cpu / max(small_cpu, 1e-3) < 10, (small_cpu, big_cpu)
