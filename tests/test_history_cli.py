"""`gpubox history BOX`: table, --last, --json, --plot, --on-box."""

import json
import shutil
from pathlib import Path

import pytest

from gpubox.bench import history, regress
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "history"


def record_series(upto=11):
    for n in range(1, upto + 1):
        doc = json.loads((FIX / f"run{n:02d}.json").read_text())
        history.record(regress.with_verdict(doc, history.runs("ct200")))


def test_json_shows_tok_s_per_tp_and_method_over_time(capsys):
    record_series()
    rc, out, _ = gpubox(capsys, "history", "ct200", "--last", "5", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["keys"] == [
        "tp1/auto/decode/out1024",
        "tp1/ddtree:15/decode/out1024",
        "tp4/auto/decode/out1024",
        "tp4/ddtree:15/decode/out1024",
        "tp8/auto/decode/out1024",
        "tp8/ddtree:15/decode/out1024",
    ]
    assert [r["run_id"][-16:] for r in doc["runs"]] == [
        "20261102T120000Z",
        "20261102T180000Z",
        "20261103T000000Z",
        "20261103T060000Z",
        "20261103T120000Z",
    ]
    assert [r["status"] for r in doc["runs"]] == ["degraded", "healthy", "degraded", "degraded", "degraded"]
    assert doc["runs"][0]["values"]["tp8/ddtree:15/decode/out1024"] == pytest.approx(229.6)
    assert doc["runs"][4]["flagged"] == ["tp4/ddtree:15/decode/out1024"]


def test_table_and_plot(tmp_path, capsys):
    record_series()
    png = tmp_path / "hist.png"
    rc, out, _ = gpubox(capsys, "history", "ct200", "--plot", str(png))
    assert rc == 0
    assert "11 run(s)" in out and "2026-11-02 12:00" in out and "229.6" in out and "degraded" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_no_history_is_a_clear_error(capsys):
    record_series(1)
    rc, _, err = gpubox(capsys, "history", "ct999")
    assert rc == 2 and "no runs recorded for ct999" in err and "ct200" in err


def test_on_box_reads_the_scheduled_runs_store(tmp_path, capsys, monkeypatch):
    from gpubox.inventory import Inventory
    from gpubox.simbox import build

    sim = build(tmp_path / "box")
    box = Inventory(sim.inventory_path).box("ct200")
    for n in range(1, 4):  # as the scheduled run-once records them: keyed by the box's identity
        doc = json.loads((FIX / f"run{n:02d}.json").read_text())
        doc["box_id"] = box.id
        history.record(regress.with_verdict(doc, history.runs(box)))
    dest = sim.cpath("/var/lib/gpubox/history")
    dest.mkdir(parents=True)
    shutil.copy(history.store_path(box), dest / f"{box.id}.jsonl")
    history.store_path(box).unlink()
    rc, out, _ = gpubox(capsys, "-i", str(sim.inventory_path), "history", "ct200", "--on-box", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["store"] == f"ct200:/var/lib/gpubox/history/{box.id}.jsonl" and len(doc["runs"]) == 3
    assert box.id == "pve1-ct200"


def test_on_box_with_a_failed_scheduled_run_is_not_shown_healthy(tmp_path, capsys):
    """The timer's service failed after the last recorded healthy run: the listing says so, exit 1."""
    from gpubox.inventory import Inventory
    from gpubox.simbox import build

    sim = build(tmp_path / "box")
    box = Inventory(sim.inventory_path).box("ct200")
    doc = json.loads((FIX / "run01.json").read_text())
    doc["box_id"] = box.id
    history.record(regress.with_verdict(doc, []))
    dest = sim.cpath("/var/lib/gpubox/history")
    dest.mkdir(parents=True)
    shutil.copy(history.store_path(box), dest / f"{box.id}.jsonl")
    argv = ["-i", str(sim.inventory_path), "history", "ct200", "--on-box"]
    rc, out, _ = gpubox(capsys, *argv, "--json")
    assert rc == 0 and json.loads(out)["schedule_failing"] is False
    assert gpubox(capsys, "-i", str(sim.inventory_path), "schedule", "install", "ct200")[0] == 0
    with sim.state() as st:
        units = st["units"]["container"]
        units.setdefault("gpubox-health-ct200.service", {"enabled": False, "active": False, "starts": 1})
        units["gpubox-health-ct200.service"]["failed"] = True
    rc, out, _ = gpubox(capsys, *argv, "--json")
    assert rc == 1 and json.loads(out)["schedule_failing"] is True
    rc, out, _ = gpubox(capsys, *argv)
    assert rc == 1 and "last run failed" in out and "journalctl -u gpubox-health-ct200.service" in out
