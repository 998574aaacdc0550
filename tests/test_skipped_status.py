"""Skipped is its own status (issue 29, point 3): never counted as ok, a run where every check was
skipped is not exit 0, and the reason for a skip is the true one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.simbox import build
from gpubox.steps import FAILED, FIXED, OK, SKIPPED, RunReport, StepResult
from tests.clirun import gpubox

PROBE = Path(__file__).resolve().parent.parent / "hwtune" / "probe.py"


def _rep(*statuses, blocked=()):
    steps = [StepResult(f"s{i}", "h", st) for i, st in enumerate(statuses)]
    for i in blocked:
        steps[i].evidence = {"blocked_by": ["s0"]}
    return RunReport("box", "check", steps)


def test_every_step_skipped_is_not_ok():
    assert not _rep(SKIPPED, SKIPPED).ok and _rep(SKIPPED, SKIPPED).exit_code == 1
    assert _rep(OK, SKIPPED).ok  # something was checked and nothing is wrong
    assert not _rep(OK, SKIPPED, blocked=[1]).ok  # blocked is a problem that remains


def test_recap_counts_skipped_apart_from_ok():
    r = _rep(OK, FIXED, FIXED, SKIPPED, FAILED, SKIPPED, blocked=[5]).recap()
    assert r == {"ok": 1, "changed": 2, "drift": 0, "failed": 1, "blocked": 1, "skipped": 1}


@pytest.fixture()
def sim(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "300")
    return build(tmp_path / "box", [], gpus=2)


def test_probe_with_every_check_skipped_exits_1(sim, capsys):
    """The simulated box has no GPU: each probe check is skipped, so the probe says nothing was
    checked and exits 1 (it used to say "ok", exit 0)."""
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "probe", "ct200")
    assert rc == 1
    assert "nothing checked" in out and "skipped=" in out and "ok=0" in out
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "probe", "ct200", "--json")
    doc = json.loads(out)
    assert rc == 1 and doc["ok"] is False and doc["recap"]["skipped"] == len(doc["steps"]) > 0


def _nvml_reason(python: str) -> str:
    code = f"import sys; sys.path.insert(0, {str(PROBE.parent)!r}); import probe; print(probe.nvml_section()[0]['reason'])"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip()


def test_pynvml_reason_only_where_it_does_not_import(tmp_path):
    # this interpreter has nvidia-ml-py (a runtime dependency): no NVML library is the reason here
    pytest.importorskip("pynvml")
    here = _nvml_reason(sys.executable)
    assert "pynvml not importable" not in here and here.startswith("no NVML"), here
    # an interpreter that cannot import it: a venv without site packages; the reason names it
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True, timeout=120
    )
    py = str(tmp_path / "v" / "bin" / "python")
    there = _nvml_reason(py)
    assert there.startswith(f"pynvml not importable by {py} (ModuleNotFoundError"), there
