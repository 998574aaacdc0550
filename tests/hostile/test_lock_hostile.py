"""Two real gpubox processes change the same simulated box at once: the second waits for the
one per-box lock or refuses with one line naming the holder (exit 2); never both at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from gpubox.simbox import build

pytestmark = pytest.mark.skipif(not shutil.which("setpci"), reason="needs pciutils")


def _slow_setpci(tmp_path, log):
    """setpci that logs start/end of each call and takes 0.3 s: overlapping changers would show."""
    d = tmp_path / "slowbin"
    d.mkdir()
    real = shutil.which("setpci")
    s = d / "setpci"
    s.write_text(
        f'#!/bin/sh\necho "start $PPID $(date +%s.%N)" >> {log}\nsleep 0.3\n'
        f'{real} "$@"\nrc=$?\necho "end $PPID $(date +%s.%N)" >> {log}\nexit $rc\n'
    )
    s.chmod(0o755)
    return d


def _start(sim, bindir, *args, wait="0.2"):
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "GPUBOX_LOCK_WAIT": wait,
        "PYTHONPATH": os.getcwd(),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpubox.cli", "-i", str(sim.inventory_path), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _writes(log) -> list[str]:
    return [ln for ln in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize(
    "second",
    [
        ("tune", "pcie", "ct200"),
        ("tune", "numa", "ct200"),
        ("stage", "ct200"),
        ("lxc", "fix", "ct200"),
        ("recover", "ct200", "--no-bench"),
    ],
)
def test_second_changer_refuses_naming_holder(tmp_path, second):
    sim = build(tmp_path / "box", ("mrrs_512",), gpus=8)
    log = tmp_path / "setpci.log"
    bindir = _slow_setpci(tmp_path, log)
    a = _start(sim, bindir, "tune", "pcie", "ct200", wait="0")
    deadline = time.monotonic() + 60
    while not log.exists() and time.monotonic() < deadline:  # A is inside its steps, lock held
        time.sleep(0.05)
    b = _start(sim, bindir, *second, wait="0.2")
    out_b, err_b = b.communicate(timeout=120)
    out_a, err_a = a.communicate(timeout=120)
    assert a.returncode == 0, out_a + err_a
    rows = [ln.split() for ln in _writes(log)]
    a_times = [float(t) for kind, pid, t in rows if pid == str(a.pid)]
    b_starts = [float(t) for kind, pid, t in rows if pid == str(b.pid) and kind == "start"]
    assert not [t for t in b_starts if min(a_times) <= t <= max(a_times)], (
        "DAMAGE: the second changer worked on the box while the first did"
    )
    assert b.returncode == 2 and "is already running (pid" in err_b, (
        f"not refused: rc={b.returncode} {err_b[-300:]}"
    )
    assert f"pid {a.pid}" in err_b and err_b.count("\n") == 1, err_b


def test_second_changer_waits_then_finds_nothing_to_do(tmp_path):
    sim = build(tmp_path / "box", ("mrrs_512",), gpus=8)
    log = tmp_path / "setpci.log"
    bindir = _slow_setpci(tmp_path, log)
    a = _start(sim, bindir, "tune", "pcie", "ct200", "--json", wait="0")
    while not log.exists():
        time.sleep(0.05)
    b = _start(sim, bindir, "tune", "pcie", "ct200", "--json", wait="120")
    out_a, err_a = a.communicate(timeout=180)
    out_b, err_b = b.communicate(timeout=180)
    assert a.returncode == 0 and b.returncode == 0, err_a + err_b
    import json

    changed_b = [s for s in json.loads(out_b)["steps"] if s["changed"]]
    assert changed_b == [], "DAMAGE: the waiting changer repeated the change"
    # every setpci call of B starts after A's last one ended: they never ran at the same time
    rows = [ln.split() for ln in _writes(log)]
    a_end = max(float(t) for kind, pid, t in rows if pid == str(a.pid) and kind == "end")
    b_start = min(float(t) for kind, pid, t in rows if pid == str(b.pid) and kind == "start")
    assert b_start >= a_end, "DAMAGE: two changers worked on the box at once"
