"""History store and regression detection on a recorded series (tests/fixtures/history)."""

import json
import multiprocessing
from pathlib import Path

import pytest

from gpubox.bench import history, regress
from gpubox.errors import GpuboxError

FIX = Path(__file__).parent / "fixtures" / "history"
TP8 = "tp8/ddtree:15/decode/out1024"
TP4 = "tp4/ddtree:15/decode/out1024"


def load(n: int) -> dict:
    return json.loads((FIX / f"run{n:02d}.json").read_text())


def replay(upto: int, settings=None) -> list[dict]:
    """Judge and record runs 1..upto the way `schedule run-once` does; return the verdicts."""
    verdicts = []
    for n in range(1, upto + 1):
        doc = regress.with_verdict(load(n), history.runs("ct200"), settings)
        history.record(doc)
        verdicts.append(doc["verdict"])
    return verdicts


def test_record_and_runs_oldest_first_without_samples():
    for n in (3, 1, 2):
        history.record(load(n))
    got = history.runs("ct200")
    assert [d["run_id"] for d in got] == [load(n)["run_id"] for n in (1, 2, 3)]
    assert all("samples" not in m for d in got for m in d["measurements"])
    assert [d["run_id"] for d in history.runs("ct200", last=2)] == [load(2)["run_id"], load(3)["run_id"]]
    assert history.boxes() == ["ct200"]


def test_record_same_run_is_idempotent_and_replaces_changed_verdict():
    doc = load(1)
    history.record(doc)
    path = history.store_path("ct200")
    before = path.read_text()
    history.record(doc)
    assert path.read_text() == before, "recording the same run twice changed the store"
    doc["verdict"] = {"status": "degraded", "reasons": [{"level": "degraded", "key": TP8}]}
    history.record(doc)
    got = history.runs("ct200")
    assert len(got) == 1 and got[0]["verdict"]["status"] == "degraded"


def test_torn_line_does_not_hide_other_runs():
    history.record(load(1))
    with open(history.store_path("ct200"), "a") as f:
        f.write('{"history": "gpubox.history/1", "doc": {"run_')
    history.record(load(2))
    assert [d["run_id"] for d in history.runs("ct200")] == [load(1)["run_id"], load(2)["run_id"]]


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"schema": "other/1", "box": "ct200", "run_id": "x", "started_at": "t"}, "schema"),
        ({"schema": "gpubox.bench/1", "box": "ct200", "started_at": "t"}, "run_id"),
        (
            {
                "schema": "gpubox.bench/1",
                "box": "ct200",
                "box_id": "../etc",
                "run_id": "x",
                "started_at": "t",
            },
            "box_id",
        ),
    ],
)
def test_bad_documents_are_refused(bad, words):
    with pytest.raises(GpuboxError, match=words):
        history.record(bad)
    assert not list(history.history_dir().glob("*.jsonl"))


def _writer(base, start):
    for n in range(start, start + 20):
        d = load(1)
        d["run_id"] = f"ct200-p{n:03d}"
        d["started_at"] = f"2026-12-01T00:{n % 60:02d}:00Z"
        history.record(d, base=Path(base))


def test_concurrent_writers_lose_nothing(tmp_path):
    procs = [multiprocessing.Process(target=_writer, args=(str(tmp_path), s)) for s in (0, 100)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert sorted(d["run_id"] for d in history.runs("ct200", base=tmp_path)) == sorted(
        [f"ct200-p{n:03d}" for n in range(0, 20)] + [f"ct200-p{n:03d}" for n in range(100, 120)]
    )


def test_baseline_is_median_of_last_healthy_runs():
    for n in range(1, 6):
        history.record(load(n))
    vals = sorted(load(n)["measurements"][5]["tok_s"] for n in range(1, 6))
    assert history.baseline("ct200", TP8) == pytest.approx(vals[2])
    # a degraded run never enters the baseline
    d = load(6)
    d["verdict"] = {"status": "degraded", "reasons": []}
    d["measurements"][5]["tok_s"] = 1.0
    history.record(d)
    assert history.baseline("ct200", TP8) == pytest.approx(vals[2])
    assert history.baseline("ct200", TP8, n=1) == pytest.approx(load(5)["measurements"][5]["tok_s"])
    assert history.baseline("nobox", TP8) is None


def test_noise_within_tolerance_is_not_flagged():
    verdicts = replay(6)
    assert [v["status"] for v in verdicts] == ["healthy"] * 6
    # run 06 really is 7% under the baseline: noise, inside the 10% tolerance
    prior = [regress.with_verdict(load(n)) for n in range(1, 6)]
    base, _ = history.baseline_of(prior, TP8)
    assert 0.06 < 1 - history.value(load(6), TP8) / base < 0.10


def test_twelve_percent_drop_is_flagged_naming_measurement_and_size():
    v = replay(7)[-1]
    assert v["status"] == "degraded"
    (r,) = v["reasons"]
    assert r["key"] == TP8 and r["kind"] == "history" and r["pattern"] == "one-off"
    assert r["drop"] == pytest.approx(0.12, abs=0.005)
    assert "TP8 ddtree:15" in r["message"] and "12.1% below the median" in r["message"]
    assert len(r["baseline_runs"]) == 5 and r["observed"] == load(7)["measurements"][5]["tok_s"]


def test_one_off_then_recovery_then_sustained_drop():
    verdicts = replay(11)
    assert verdicts[7]["status"] == "healthy", "run 08 recovered; the one-off drop must not linger"
    patterns = [
        (v["reasons"][0]["key"], v["reasons"][0]["pattern"], v["reasons"][0]["runs_below"])
        for v in verdicts[8:11]
    ]
    assert patterns == [(TP4, "one-off", 1), (TP4, "one-off", 2), (TP4, "sustained", 3)]
    assert "sustained: 3 runs in a row" in verdicts[10]["reasons"][0]["message"]
    # the sustained drop did not become the new normal
    assert history.baseline("ct200", TP4) == pytest.approx(verdicts[8]["reasons"][0]["baseline"])
    assert verdicts[10]["reasons"][0]["baseline"] == verdicts[8]["reasons"][0]["baseline"]


def test_window_tolerance_and_sustained_are_configurable():
    loose = regress.Settings(tolerance=0.15)
    assert [v["status"] for v in replay(7, loose)] == ["healthy"] * 7


def test_two_run_sustain_and_min_runs():
    s = regress.Settings(sustained=2)
    verdicts = replay(10, s)
    assert verdicts[9]["reasons"][0]["pattern"] == "sustained"


def test_no_baseline_before_min_runs():
    d = load(7)
    prior = [load(n) for n in (1, 2)]
    assert regress.decide(d, prior, regress.Settings(min_runs=3))["status"] == "healthy"
    assert regress.decide(d, prior, regress.Settings(min_runs=2))["status"] == "degraded"


def test_expectation_from_inventory_flags_without_history():
    exp = {"tp8": {"ddtree:15": 263.9}, "tp1": {"auto": 26.6}}
    v = regress.decide(load(7), [], regress.Settings(expect=exp, expect_tolerance=0.10))
    (r,) = v["reasons"]
    assert r["kind"] == "expectation" and r["expected"] == 263.9 and r["key"] == TP8
    assert "below the expected 263.9" in r["message"]
    assert regress.decide(load(6), [], regress.Settings(expect=exp))["status"] == "healthy"


def test_failed_measurement_fails_the_run():
    v = regress.decide(load(12), [load(n) for n in range(1, 6)])
    assert v["status"] == "failed"
    assert {r["key"] for r in v["reasons"]} == {"tp8/auto/decode/out1024", TP8}
    assert "CUDA error 999" in v["reasons"][0]["message"]


def test_merge_keeps_worst_status_and_does_not_repeat_a_reason():
    bench_v = {
        "status": "degraded",
        "reasons": [{"level": "degraded", "key": TP8, "expected": 263.9, "message": "bench's own"}],
    }
    mine = regress.decide(load(7), [], regress.Settings(expect={"tp8": {"ddtree:15": 263.9}}))
    merged = regress.merge(bench_v, mine)
    assert merged["status"] == "degraded" and len(merged["reasons"]) == 1
    assert (
        regress.merge({"status": "healthy", "reasons": []}, {"status": "failed", "reasons": []})["status"]
        == "failed"
    )


def test_simulated_runs_do_not_set_the_baseline_of_real_ones():
    prior = []
    for n in range(1, 6):
        d = load(n)
        d["simulated"] = True
        for m in d["measurements"]:
            m["tok_s"] = m["tok_s"] * 2
        prior.append(d)
    assert regress.decide(load(6), prior)["status"] == "healthy"


def test_settings_validation_names_the_value():
    with pytest.raises(GpuboxError, match="tolerance"):
        regress.Settings(tolerance=10)
    with pytest.raises(GpuboxError, match="window"):
        regress.Settings(window=0)


def test_any_box_name_stays_inside_the_history_directory():
    """Names are encoded injectively (gpubox.identity.encode_name), never used as paths."""
    names = ["../etc", "a/b", "a_b", "a.b", "gpu.a", "gpu_a", "x" * 300, "pve1-ct200"]
    paths = {history.store_path(n) for n in names}
    assert len(paths) == len(names)
    for p in paths:
        assert p.parent == history.history_dir() and len(p.name) < 255
