"""`gpubox schedule run-once`: lock (two processes), history, verdict, .prom file, alert hook."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpubox.bench import history
from gpubox.cli import main
from gpubox.simbox import build
from tests.bench_helpers import fell_behind

FIX = Path(__file__).parent / "fixtures" / "history"
PROM = "/var/lib/prometheus/node-exporter/gpubox_ct200.prom"
# The seed's reference figures (docs/facts.md), as a real box's inventory would expect them.
EXPECT = {
    "tolerance": 0.10,
    "tok_s": {
        "tp1": {"auto": 26.6, "ddtree:15": 173.4},
        "tp4": {"auto": 37.8, "ddtree:15": 281.1},
        "tp8": {"auto": 37.6, "ddtree:15": 263.9},
    },
}


def box_of(sim):
    """The inventory Box: run-once keys its history by the box's identity (Proxmox host + vmid)."""
    from gpubox.inventory import Inventory

    return Inventory(sim.inventory_path).box("ct200")


def hook(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(f"#!{sys.executable}\nimport sys, time, pathlib\n{body}\n")
    p.chmod(0o755)
    return str(p)


def make_sim(tmp_path, alert=None, alert_timeout=None):
    sim = build(tmp_path / "box")
    extra = sim.inventory_extra["container"]
    extra["gpubox_bench"] = {"expect": EXPECT, "regress": {"window": 5, "tolerance": 0.10, "sustained": 3}}
    if alert:
        extra["gpubox_alert_command"] = alert
    if alert_timeout:
        extra["gpubox_alert_timeout"] = alert_timeout
    sim.write_inventory()
    return sim


def run_once(capsys, sim, n, *extra):
    with pytest.raises(SystemExit) as ei:
        main(
            [
                "-i",
                str(sim.inventory_path),
                "schedule",
                "run-once",
                "ct200",
                "--no-doctor",
                "--from-json",
                str(FIX / f"run{n:02d}.json"),
                "--json",
                *extra,
            ]
        )
    out, err = capsys.readouterr()
    return ei.value.code, (json.loads(out) if out.strip() else None), err


def test_series_records_history_writes_metrics_and_alerts_once(tmp_path, capsys):
    got = tmp_path / "alerts.jsonl"
    sim = make_sim(
        tmp_path,
        alert=[
            hook(tmp_path, "notify", f"open({str(got)!r}, 'a').write(sys.stdin.read())"),
            "--team",
            "inference",
        ],
    )
    for n in range(1, 7):
        rc, res, _ = run_once(capsys, sim, n)
        assert rc == 0 and res["status"] == "healthy", res
        assert res["alert"] == {"fired": False, "reason": "verdict is healthy"}
    assert not got.exists()
    rc, res, _ = run_once(capsys, sim, 7)
    assert rc == 1 and res["status"] == "degraded"
    kinds = {(r["kind"], r["key"]) for r in res["reasons"]}
    assert kinds == {
        ("history", "tp8/ddtree:15/decode/out1024"),
        ("expectation", "tp8/ddtree:15/decode/out1024"),
    }
    # the hook got the verdict JSON on stdin
    (payload,) = [json.loads(l) for l in got.read_text().splitlines()]
    assert payload["status"] == "degraded" and payload["run_id"] == "ct200-20261102T120000Z"
    assert any("12.1% below the median" in r["message"] for r in payload["reasons"])
    assert res["alert"]["ok"] and res["alert"]["rc"] == 0
    # history holds the judged runs
    runs = history.runs(box_of(sim))
    assert [r["verdict"]["status"] for r in runs] == ["healthy"] * 6 + ["degraded"]
    # metrics in the container's textfile dir, parseable, health 1
    text = sim.cpath(PROM).read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["gpubox_health"].samples[0].value == 1
    tok = {s.labels["key"]: s.value for s in fams["gpubox_bench_tokens_per_second"].samples}
    assert tok["tp8/ddtree:15/decode/out1024"] == pytest.approx(229.6)
    leftovers = [p.name for p in sim.cpath(PROM).parent.iterdir() if p.name != "gpubox_ct200.prom"]
    assert leftovers == [], "temporary files must not be left in the textfile dir"


def test_failing_alert_command_is_reported_not_fatal(tmp_path, capsys):
    sim = make_sim(
        tmp_path, alert=[hook(tmp_path, "broken", "sys.stderr.write('pager down\\n'); sys.exit(3)")]
    )
    rc, res, _ = run_once(capsys, sim, 12)
    assert rc == 1 and res["status"] == "failed"
    assert res["alert"]["fired"] and not res["alert"]["ok"] and res["alert"]["rc"] == 3
    assert "alert command failed: exited 3: pager down" in res["notes"]
    assert history.runs(box_of(sim))[-1]["verdict"]["status"] == "failed", "the run is still recorded"
    fams = {f.name: f for f in text_string_to_metric_families(sim.cpath(PROM).read_text())}
    assert fams["gpubox_health"].samples[0].value == 2


def test_hanging_alert_command_times_out(tmp_path, capsys):
    sim = make_sim(tmp_path, alert=[hook(tmp_path, "hang", "time.sleep(30)")], alert_timeout=1)
    t0 = time.monotonic()
    rc, res, _ = run_once(capsys, sim, 7)
    assert time.monotonic() - t0 < 30  # not the hook's own 30 s: the 1 s alert timeout ended it
    assert rc == 1 and res["alert"]["fired"] and not res["alert"]["ok"]
    assert "timed out" in res["alert"]["error"]


def test_alert_command_as_shell_string_is_refused(tmp_path, capsys):
    sim = make_sim(tmp_path, alert="notify-oncall --team x | mail")
    rc, res, err = run_once(capsys, sim, 1)
    assert (
        rc == 2 and "argv list" in err and res == {"error": err.strip(), "exit_code": 2}
    )  # --json: the error object
    assert history.runs(box_of(sim)) == [], "bad settings are refused before anything is recorded"


def test_result_of_another_box_is_refused(tmp_path, capsys):
    sim = make_sim(tmp_path)
    doc = json.loads((FIX / "run01.json").read_text())
    doc["box"] = "ct201"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with pytest.raises(SystemExit) as ei:
        main(
            [
                "-i",
                str(sim.inventory_path),
                "schedule",
                "run-once",
                "ct200",
                "--no-doctor",
                "--from-json",
                str(other),
            ]
        )
    assert ei.value.code == 2 and "result of ct201" in capsys.readouterr().err


def test_benchmark_that_cannot_run_becomes_a_failed_run(tmp_path):
    from gpubox.bench.runonce import run_benchmark

    doc = run_benchmark(str(tmp_path / "no-such-inventory.yml"), "ct200", "health", 60, True)
    assert doc["verdict"]["status"] == "failed" and doc["measurements"] == []
    assert "does not exist" in doc["verdict"]["reasons"][0]["message"]
    history.validate(doc)


def test_overlapping_runs_are_refused(tmp_path):
    """Two real gpubox processes: the second is refused while the first holds the lock."""
    started = tmp_path / "started"
    slow = hook(tmp_path, "slow-notify", f"pathlib.Path({str(started)!r}).touch(); time.sleep(6)")
    sim = make_sim(tmp_path, alert=[slow])
    env = dict(os.environ)
    base = [
        sys.executable,
        "-m",
        "gpubox.cli",
        "-i",
        str(sim.inventory_path),
        "schedule",
        "run-once",
        "ct200",
        "--no-doctor",
        "--json",
        "--from-json",
    ]
    first = subprocess.Popen(
        base + [str(FIX / "run07.json")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "first run never reached its alert hook"
            time.sleep(0.05)
        second = subprocess.run(
            base + [str(FIX / "run01.json")], env=env, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 2
        assert f"already running (pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 1 and json.loads(out)["status"] == "degraded"
    # only the first run was recorded; the lock is free again afterwards
    assert [r["run_id"] for r in history.runs(box_of(sim))] == ["ct200-20261102T120000Z"]
    third = subprocess.run(
        base + [str(FIX / "run01.json")], env=env, capture_output=True, text=True, timeout=60
    )
    assert third.returncode == 0, third.stderr


def test_end_to_end_with_the_real_benchmark_on_the_simulated_server(tmp_path, capsys):
    """run-once runs `gpubox bench` (child process) against the simulated vLLM server, TP1 only."""
    import yaml

    sim = build(tmp_path / "box")
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"]["tp"] = [1]
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    with pytest.raises(SystemExit) as ei:
        main(["-i", str(sim.inventory_path), "schedule", "run-once", "ct200", "--no-doctor", "--json"])
    res = json.loads(capsys.readouterr().out)
    assert (ei.value.code == 0 and res["status"] == "healthy") or fell_behind(sim), res
    (run,) = history.runs(box_of(sim))
    assert run["run_id"] == res["run_id"] and run["simulated"] is True
    keys = {m["key"] for m in run["measurements"] if m["status"] == "ok"}
    assert {"tp1/auto/decode/out1024", "tp1/ddtree:15/decode/out1024"} <= keys
    fams = {f.name: f for f in text_string_to_metric_families(sim.cpath(PROM).read_text())}
    assert {s.labels["key"] for s in fams["gpubox_bench_tokens_per_second"].samples} >= keys
    assert fams["gpubox_health"].samples[0].value == 0


def test_manual_bench_is_refused_while_a_health_check_holds_the_lock(tmp_path, capsys):
    """`gpubox bench` takes the same per-box lock as the scheduled run."""
    from gpubox.bench.runonce import run_lock
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.simbox import build
    from tests.clirun import gpubox

    sim = build(tmp_path / "box", [])
    inv = Inventory(sim.inventory_path)
    holder = subprocess.Popen(  # another process holds it (in-process the lock is re-entrant)
        [
            sys.executable,
            "-c",
            "import sys, time; from gpubox.context import Context; from gpubox.inventory import Inventory;"
            "from gpubox.bench.runonce import run_lock; inv = Inventory(sys.argv[1]);"
            "ctx = Context(box=inv.box('ct200'), inventory=inv)\n"
            "with run_lock(ctx, 'test holder'):\n print('held', flush=True); sys.stdin.read()",
            str(sim.inventory_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "bench", "ct200", "--json")
    finally:
        holder.communicate("", timeout=30)
    assert rc == 2 and "`test holder` is already running (pid" in err, err
    assert len(err.strip().splitlines()) == 1
    with run_lock(Context(box=inv.box("ct200"), inventory=inv)):  # free again once the holder left
        pass
