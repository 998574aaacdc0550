"""Oracle: SIGKILL at every commit point, then re-run (issue 37, faults).

A run of a front-end command on a simulated box is counted (tests/hostile/killrun.py: every
rename, unlink and fsync gpubox's process makes); then, for each commit point k (sampled evenly,
first and last included; GPUBOX_ORACLE_FULL=1 tries every one), a fresh copy of the box gets the
command killed with SIGKILL at its k-th commit point, and the command run again to the end. The
re-run must end cleanly, the box must hold exactly the files (and contents) a run that was never
killed leaves, and no temp of gpubox's may be left anywhere in the box or the state directory.

    .venv/bin/python -m pytest -q -m oracle tests/hostile/test_oracle_kill.py
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.safeio import is_tmp
from tests.hostile import linkoracle as lo

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = 4  # kill points per command in a sampled run (first, last, two between)
# name: (faults, argv after `-i INVENTORY`)
COMMANDS = {
    "recover": (("seed",), ["recover", "ct200", "--yes", "--no-bench", "--skip", "stage"]),
    "schedule-install": ((), ["schedule", "install", "ct200", "--every", "6h"]),
}
_TEMP = re.compile(r"(\.gpubox\.tmp\.|\.gpubox\.[0-9a-f]+\.tmp$|\.conf\.tmp\.[0-9]+$|\.tmp$)")
# Files whose content is not the box's end state: the simulator's clock-stamped bookkeeping.
_VOLATILE = re.compile(r"(^|/)(run/lock/gpubox/[^/]*\.holder|var/log/.*)$")


def _run(box: lo.Box, argv: list[str], k: int, count_file: Path) -> subprocess.CompletedProcess:
    # No bytecode writes: Python commits a fresh .pyc with os.replace, so on a clean clone the
    # counting run would see commit points that a later run (with the .pyc there) never reaches.
    env = dict(
        os.environ,
        GPUBOX_STATE_DIR=str(box.state),
        GPUBOX_LOCK_WAIT="0",
        PYTHONPATH=str(ROOT),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.hostile.killrun",
            str(k),
            str(count_file),
            "-i",
            str(box.sim.inventory_path),
            *argv,
        ],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _end_state(box: lo.Box) -> dict:
    """The files of the box's two roots: path -> (type, mode, content digest); mtimes ignored."""
    out = {}
    for where in ("host", "ct"):
        root = box.roots[where]
        for rel, (fmt, mode, _uid, _size, _mtime, digest) in lo.snapshot(root).items():
            if not _VOLATILE.search(rel):
                out[f"{where}/{rel}"] = (fmt, mode, digest)
    return out


def _temps(box: lo.Box) -> list[str]:
    left = []
    for root in box.roots.values():
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                if is_tmp(n) or _TEMP.search(n):
                    left.append(os.path.join(dirpath, n))
    return sorted(left)


def _points(n: int) -> list[int]:
    if lo.FULL or n <= SAMPLE:
        return list(range(1, n + 1))
    step = (n - 1) / (SAMPLE - 1)
    return sorted({1 + round(i * step) for i in range(SAMPLE)})


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_run_killed_at_any_commit_point_converges_when_run_again(name, tmp_path):
    faults, argv = COMMANDS[name]
    box = lo.ScheduledBox(tmp_path / "b", faults)
    count = tmp_path / "count"
    box.reset()
    r = _run(box, argv, 0, count)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr[-2000:]
    n = int(count.read_text())
    want = _end_state(box)
    assert not _temps(box), _temps(box)

    problems = []
    points = _points(n)
    for k in points:
        box.reset()
        killed = _run(box, argv, k, count)
        if killed.returncode != -signal.SIGKILL:
            problems.append(f"k={k}: the run was not killed (exit {killed.returncode})")
            continue
        again = _run(box, argv, -1, count)
        why = lo.clean_outcome(again.returncode, again.stderr)
        if why or again.returncode not in (0, 1):
            problems.append(f"k={k}: the re-run did not end cleanly: {why or again.returncode}")
        got = _end_state(box)
        diff = sorted(p for p in set(want) | set(got) if want.get(p) != got.get(p))
        if diff:
            problems.append(f"k={k}: end state differs from an unkilled run's: {diff[:8]}")
        left = _temps(box)
        if left:
            problems.append(f"k={k}: temps left behind: {left}")
    figures = {
        "command": name,
        "commit_points": n,
        "killed_at": len(points),
        "problems": len(problems),
        "full": lo.FULL,
    }
    report = os.environ.get("GPUBOX_ORACLE_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(figures) + "\n")
    print(json.dumps(figures))
    assert not problems, "\n".join(problems)
