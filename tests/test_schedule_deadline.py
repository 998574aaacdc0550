"""A scheduled run keeps its own time limit (issue 38): the benchmark's whole process group is
killed at the limit, a SIGTERM (coreutils timeout in the container) ends the run through its
finally blocks, and a run that was stopped releases the box lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpubox.bench import runonce
from gpubox.simbox import build
from tests.test_schedule_runonce import EXPECT  # run07 is degraded against these

FIX = Path(__file__).parent / "fixtures" / "history"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie of ours would still answer: read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z"
    except OSError:
        return True


def test_run_child_kills_the_whole_group_at_the_limit(tmp_path):
    pidfile = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time, pathlib\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"pathlib.Path({str(pidfile)!r}).write_text(str(g.pid))\n"
        "time.sleep(60)\n"
    )
    t0 = time.monotonic()
    got = runonce.run_child([sys.executable, "-c", code], 1.5)
    assert got is None and time.monotonic() - t0 < 20
    gpid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(gpid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(gpid), "the benchmark's server (a grandchild) outlived the time limit"


def test_a_benchmark_past_its_limit_is_a_failed_run(monkeypatch):
    monkeypatch.setattr(runonce, "CHILD_BOOT", "import time; time.sleep(60)")
    t0 = time.monotonic()
    doc = runonce.run_benchmark(None, "ct200", "health", 1.0, True)
    assert time.monotonic() - t0 < 20
    assert doc["verdict"]["status"] == "failed"
    assert "time limit" in doc["verdict"]["reasons"][0]["message"]


def test_sigterm_ends_the_run_and_releases_the_box_lock(tmp_path):
    started = tmp_path / "started"
    hook = tmp_path / "slow-notify"
    hook.write_text(
        f"#!{sys.executable}\nimport pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\n"
    )
    hook.chmod(0o755)
    sim = build(tmp_path / "box")
    extra = sim.inventory_extra["container"]
    extra["gpubox_bench"] = {"expect": EXPECT, "regress": {"window": 5, "tolerance": 0.10, "sustained": 3}}
    extra["gpubox_alert_command"] = [str(hook)]
    extra["gpubox_alert_timeout"] = 120
    sim.write_inventory()
    base = [
        sys.executable,
        "-m",
        "gpubox.cli",
        "-i",
        str(sim.inventory_path),
        "schedule",
        "run-once",
        "ct200",
    ]
    base += ["--no-doctor", "--json", "--from-json"]
    run = subprocess.Popen(
        base + [str(FIX / "run07.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        run.send_signal(signal.SIGTERM)  # what coreutils timeout sends at the limit
        out, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
    assert time.monotonic() - t0 < 15  # not the hook's 60 s
    # the run wraps up (it was recorded before the alert) and says the alert was stopped
    assert run.returncode == 1 and "Traceback" not in err, err
    res = json.loads(out)
    assert res["status"] == "degraded" and any("stopped by SIGTERM" in n for n in res["notes"]), res
    # the lock went with it: the next run is not refused
    nxt = subprocess.run(
        base + [str(FIX / "run01.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPUBOX_LOCK_WAIT": "0"},
    )
    assert nxt.returncode in (0, 1) and json.loads(nxt.stdout)["box"] == "ct200", nxt.stderr
