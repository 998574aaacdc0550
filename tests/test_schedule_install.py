"""`gpubox schedule install|status|remove` against a simulated box (systemctl stand-in, real files)."""

import json
import shutil

import pytest

from gpubox.simbox import build
from tests.clirun import gpubox

UNIT = "etc/systemd/system/gpubox-health-ct200"


@pytest.fixture
def sim(tmp_path):
    """A healthy simulated box with gpubox and an inventory installed in the container."""
    box = build(tmp_path / "box")
    (box.cpath("/usr/local/bin")).mkdir(parents=True, exist_ok=True)
    exe = box.cpath("/usr/local/bin/gpubox")
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    shutil.copy(box.inventory_path, box.cpath("/etc/gpubox/inventory.yml"))
    return box


def cli(capsys, sim, *argv):
    return gpubox(capsys, "-i", str(sim.inventory_path), *argv)


def systemctl_calls(sim, *verbs):
    return [c["argv"] for c in sim.calls("systemctl") if not verbs or c["argv"][0] in verbs]


def test_dry_run_prints_units_and_changes_nothing(sim, capsys):
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--every", "4h", "--dry-run")
    assert rc == 1  # drift found, nothing changed
    assert "# /etc/systemd/system/gpubox-health-ct200.service" in out
    assert "OnUnitActiveSec=4h" in out and "TimeoutStartSec=7200" in out
    assert "would run: systemctl enable --now gpubox-health-ct200.timer" in out
    assert not sim.cpath(f"/{UNIT}.service").exists()


def test_host_mode_needs_coreutils_timeout_in_the_container(sim, capsys):
    sim.cpath("/usr/bin/timeout").unlink()
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--on", "host", "--json")
    step = json.loads(out)["steps"][0]
    assert rc == 1 and step["status"] == "failed" and "/usr/bin/timeout is not in ct200" in step["detail"]
    assert not sim.hpath(f"/{UNIT}.service").exists()
    assert systemctl_calls(sim, "daemon-reload", "enable") == []


def test_install_enables_and_second_run_changes_nothing(sim, capsys):
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--json")
    assert rc == 0, out
    rep = json.loads(out)
    assert rep["steps"][0]["status"] == "fixed" and rep["changed"]
    assert sim.cpath(f"/{UNIT}.service").read_text() == rep["files"][f"/{UNIT}.service"]
    assert "OnUnitActiveSec=6h" in sim.cpath(f"/{UNIT}.timer").read_text()
    assert systemctl_calls(sim, "daemon-reload", "enable") == [
        ["daemon-reload"],
        ["enable", "--now", "gpubox-health-ct200.timer"],
    ]
    st = sim.read_state()["units"]["container"]["gpubox-health-ct200.timer"]
    assert st["enabled"] and st["active"]
    assert not sim.hpath(f"/{UNIT}.timer").exists(), "container mode must not touch the host"

    before = len(systemctl_calls(sim, "daemon-reload", "enable"))
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--json")
    rep = json.loads(out)
    assert rc == 0 and rep["steps"][0]["status"] == "ok" and not rep["changed"]
    assert len(systemctl_calls(sim, "daemon-reload", "enable")) == before


def test_changed_interval_rewrites_with_backup(sim, capsys):
    cli(capsys, sim, "schedule", "install", "ct200", "--json")
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--on-calendar", "*-*-* 03:00:00", "--json")
    assert rc == 0
    rep = json.loads(out)
    assert (
        "-OnUnitActiveSec=6h" in rep["steps"][0]["diff"]
        and "+OnCalendar=*-*-* 03:00:00" in rep["steps"][0]["diff"]
    )
    assert "OnCalendar=*-*-* 03:00:00" in sim.cpath(f"/{UNIT}.timer").read_text()
    from gpubox.state import state_dir

    (backup,) = (state_dir() / "backups" / "ct200").glob("etc__systemd__system__gpubox-health-ct200.timer.*")
    assert "OnUnitActiveSec=6h" in backup.read_text()


def test_bad_calendar_is_refused_before_anything_is_written(sim, capsys):
    rc, _, err = cli(capsys, sim, "schedule", "install", "ct200", "--on-calendar", "whenever")
    assert rc == 2 and "not valid" in err and "Traceback" not in err
    assert not sim.cpath(f"/{UNIT}.timer").exists()


def test_missing_gpubox_in_container_fails_without_writing(sim, capsys):
    sim.cpath("/usr/local/bin/gpubox").unlink()
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--json")
    rep = json.loads(out)
    assert rc == 1 and rep["steps"][0]["status"] == "failed"
    assert "gpubox is not at /usr/local/bin/gpubox" in rep["steps"][0]["detail"]
    assert not sim.cpath(f"/{UNIT}.service").exists()


def test_status_and_remove(sim, capsys):
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200", "--json")
    assert rc == 1 and json.loads(out)["installed"] is False
    cli(capsys, sim, "schedule", "install", "ct200", "--json")
    # a run recorded on the box (its state dir, as the unit sets it)
    # (keyed by the box's identity, Proxmox host + vmid; a document of gpubox.bench/1)
    hist = sim.cpath("/var/lib/gpubox/history/pve1-ct200.jsonl")
    hist.parent.mkdir(parents=True)
    hist.write_text(
        json.dumps(
            {
                "history": "gpubox.history/1",
                "doc": {
                    "schema": "gpubox.bench/1",
                    "box": "ct200",
                    "box_id": "pve1-ct200",
                    "measurements": [],
                    "run_id": "ct200-20261129T060000Z",
                    "started_at": "2026-11-29T06:00:00Z",
                    "verdict": {
                        "status": "degraded",
                        "reasons": [{"message": "TP8 ddtree:15 decode 12.1% below"}],
                    },
                },
            }
        )
        + "\n"
    )
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200", "--json")
    st = json.loads(out)
    assert rc == 0 and st["installed"] and st["enabled"] == "enabled" and st["active"] == "active"
    assert st["last_run"]["status"] == "degraded" and st["runs"] == 1
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200")
    assert "enabled, active" in out and "12.1% below" in out

    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--dry-run", "--json")
    assert rc == 1 and sim.cpath(f"/{UNIT}.timer").exists()
    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--json")
    assert rc == 0 and json.loads(out)["steps"][0]["status"] == "fixed"
    assert not sim.cpath(f"/{UNIT}.timer").exists() and not sim.cpath(f"/{UNIT}.service").exists()
    assert ["disable", "--now", "gpubox-health-ct200.timer"] in systemctl_calls(sim, "disable")
    st = sim.read_state()["units"]["container"]["gpubox-health-ct200.timer"]
    assert not st["enabled"] and not st["active"]
    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--json")
    assert rc == 0 and json.loads(out)["steps"][0]["status"] == "ok"


def test_cron_fallback_without_systemd(sim, capsys):
    sim.cpath("/run/systemd/system").rmdir()
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--every", "12h", "--json")
    assert rc == 0, out
    cron = sim.cpath("/etc/cron.d/gpubox-health-ct200").read_text()
    assert "0 */12 * * * root timeout --kill-after=60 7200 /usr/local/bin/gpubox" in cron
    assert systemctl_calls(sim, "daemon-reload", "enable") == []
    rc, _, err = cli(capsys, sim, "schedule", "install", "ct200", "--on-calendar", "daily")
    assert rc == 2 and "needs systemd" in err
    rc, out, _ = cli(capsys, sim, "schedule", "remove", "ct200", "--json")
    assert rc == 0 and not sim.cpath("/etc/cron.d/gpubox-health-ct200").exists()


def test_host_mode_units_on_the_proxmox_host(sim, capsys):
    rc, out, _ = cli(capsys, sim, "schedule", "install", "ct200", "--on", "host", "--json")
    assert rc == 0, out
    svc = sim.hpath(f"/{UNIT}.service").read_text()
    assert (
        "ExecStart=/usr/sbin/pct exec 200 -- /usr/bin/timeout --kill-after=60 7200s "
        "/usr/bin/env GPUBOX_STATE_DIR=/var/lib/gpubox /usr/local/bin/gpubox" in svc
    )
    assert "TimeoutStartSec=7320" in svc  # systemd's limit: a backstop past the run's own
    assert sim.read_state()["units"]["host"]["gpubox-health-ct200.timer"]["enabled"]
    assert not sim.cpath(f"/{UNIT}.service").exists()


def test_steps_for_the_recover_pipeline(sim):
    from gpubox.bench.schedule_step import ScheduleStep, steps
    from gpubox.context import Context
    from gpubox.inventory import Inventory

    inv = Inventory(sim.inventory_path)
    assert steps(Context(box=inv.box("ct200"), inventory=inv)) == [], "no gpubox_schedule: no step"
    sim.inventory_extra["container"]["gpubox_schedule"] = {"every": "8h"}
    sim.write_inventory()
    inv = Inventory(sim.inventory_path)
    (step,) = steps(Context(box=inv.box("ct200"), inventory=inv))
    assert isinstance(step, ScheduleStep) and step.spec.every == 8 * 3600


def test_status_of_a_timer_whose_last_run_failed_is_failing(sim, capsys):
    """Enabled and active timer, but the service's last run exited non-zero: systemd shows the
    service "failed"; status must say so and exit 1, never show a healthy schedule."""
    cli(capsys, sim, "schedule", "install", "ct200", "--json")
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200", "--json")
    assert rc == 0 and json.loads(out)["failing"] is False
    with sim.state() as st:
        st["units"]["container"].setdefault(
            "gpubox-health-ct200.service", {"enabled": False, "active": False, "starts": 1}
        )
        st["units"]["container"]["gpubox-health-ct200.service"]["failed"] = True
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200", "--json")
    st = json.loads(out)
    assert rc == 1 and st["failing"] and st["last_service_state"] == "failed" and not st["ok"]
    rc, out, _ = cli(capsys, sim, "schedule", "status", "ct200")
    assert rc == 1 and "last service run" in out and "failed" in out
