"""Scheduled checks as a newcomer meets them (issue 29, point 6): install advice that works under
PEP 668, status sees the runs `schedule run-once` made and says when the next one is, remove
takes the .prom textfile with it (else node_exporter exports the last verdict for ever)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpubox.simbox import build
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "history"
PROM = "/var/lib/prometheus/node-exporter/gpubox_ct200.prom"


@pytest.fixture
def sim(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "300")
    box = build(tmp_path / "box")
    box.cpath("/usr/local/bin").mkdir(parents=True, exist_ok=True)
    exe = box.cpath("/usr/local/bin/gpubox")
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    shutil.copy(box.inventory_path, box.cpath("/etc/gpubox/inventory.yml"))
    return box


def cli(capsys, sim, *argv):
    return gpubox(capsys, "-i", str(sim.inventory_path), *argv)


def test_install_advice_is_a_venv_not_pip_into_the_system(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    box = build(tmp_path / "bare")
    box.cpath("/usr/local/bin/gpubox").unlink()  # a container gpubox was never installed in
    rc, out, err = gpubox(capsys, "-i", str(box.inventory_path), "schedule", "install", "ct200", "--json")
    step = json.loads(out)["steps"][0]
    assert rc == 1 and step["status"] == "failed"
    assert "pip install" not in step["repair"]
    assert "./install.sh" in step["repair"] and "playbooks/bench.yml -l ct200" in step["repair"]
    assert "/opt/gpubox/venv/bin/gpubox" in step["repair"]
    # the role's gpubox is where the advice says it is (console script of the venv it makes)
    tasks = (Path(__file__).parent.parent / "playbooks/roles/gpubox_install/defaults/main.yml").read_text()
    assert "/venv" in tasks


def _run_once(capsys, sim):
    """`schedule run-once` of the recorded run01 result (no doctor, no live benchmark)."""
    return cli(
        capsys,
        sim,
        "schedule",
        "run-once",
        "ct200",
        "--no-doctor",
        "--from-json",
        FIX / "run01.json",
        "--json",
    )


def test_status_sees_run_once_and_shows_the_next_run(sim, capsys):
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--every", "6h", "--json")
    assert rc == 0, out
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200", "--json")
    st = json.loads(out)
    assert st["runs"] == 0 and st["next_run"]  # systemd's NextElapseUSecRealtime of the timer
    rc, out, err = _run_once(capsys, sim)
    assert rc in (0, 1), err
    run_id = json.loads(out)["run_id"]
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200", "--json")
    st = json.loads(out)
    assert st["runs"] == 1 and st["last_run"]["run_id"] == run_id
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200")
    assert "next run" in out and "recorded in" in out


def test_remove_takes_the_prom_textfile(sim, capsys):
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--json")
    assert rc == 0
    rc, out, err = _run_once(capsys, sim)
    assert sim.cpath(PROM).exists(), err
    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--dry-run", "--json")
    assert rc == 1 and PROM in json.dumps(json.loads(out)["steps"][0]["diff"]) and sim.cpath(PROM).exists()
    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--json")
    assert rc == 0 and not sim.cpath(PROM).exists()
    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--json")
    assert rc == 0 and json.loads(out)["changed"] is False  # nothing left to remove
