"""kernel.numa_balancing on the simulated host's /proc/sys (never this machine's)."""

from __future__ import annotations

import json
import subprocess
import sys

from gpubox.context import Context
from gpubox.hwtune import steps
from gpubox.hwtune.numa import CONF, KNOB
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.simbox import build


def make(tmp_path, faults=(), **options):
    sim = build(tmp_path / "box", faults, gpus=2)
    inv = Inventory(sim.inventory_path)
    return sim, Context(box=inv.box("ct200"), inventory=inv, options=options)


def numa(ctx, mode):
    return run_steps(ctx, steps(ctx, ("numa-balancing",)), mode)


def test_healthy_is_ok(tmp_path):
    _, ctx = make(tmp_path)
    assert numa(ctx, "check").steps[0].status == "ok"


def test_on_is_found_and_turned_off_once(tmp_path):
    sim, ctx = make(tmp_path, ["numa_balancing"])
    chk = numa(ctx, "check").steps[0]
    assert chk.status == "drift" and "kernel.numa_balancing = 1 (on), want 0" in chk.detail
    rep = numa(ctx, "apply")
    assert rep.steps[0].status == "fixed" and rep.changed
    assert sim.hpath(KNOB).read_text() == "0\n"
    assert rep.steps[0].commands == [["tee", str(sim.hpath(KNOB))]]
    again = numa(ctx, "apply")
    assert again.steps[0].status == "ok" and not again.changed


def test_dry_run_changes_nothing(tmp_path):
    sim, _ = make(tmp_path, ["numa_balancing"])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpubox.cli",
            "-i",
            str(sim.inventory_path),
            "tune",
            "numa",
            "ct200",
            "--dry-run",
            "--persist",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    st = json.loads(r.stdout)["steps"][0]
    assert "would write 0" in st["detail"] and f"+++ b{CONF}" in st["diff"]
    assert sim.hpath(KNOB).read_text() == "1\n" and not sim.hpath(CONF).exists()


def test_persist_writes_sysctl_d(tmp_path):
    sim, ctx = make(tmp_path, ["numa_balancing"], persist=True)
    rep = numa(ctx, "apply")
    assert rep.steps[0].status == "fixed", rep.steps[0].detail
    assert "kernel.numa_balancing = 0" in sim.hpath(CONF).read_text()
    assert numa(ctx, "apply").changed is False


def test_persist_when_live_already_off(tmp_path):
    sim, ctx = make(tmp_path, persist=True)
    sim.hpath(CONF).unlink()  # live value right, but nothing makes it survive a reboot
    chk = numa(ctx, "check").steps[0]
    assert chk.status == "drift" and "at boot: kernel default" in chk.detail
    rep = numa(ctx, "apply").steps[0]
    assert rep.status == "fixed" and rep.commands == []  # only the file, no live write
    assert sim.hpath(CONF).exists()


def test_later_sysctl_file_overriding_is_reported(tmp_path):
    sim, ctx = make(tmp_path, persist=True)
    sim.hpath("/etc/sysctl.d/99-local.conf").write_text("kernel.numa_balancing = 1\n")
    rep = numa(ctx, "apply").steps[0]
    assert rep.status == "failed"
    assert "99-local.conf" in rep.detail and "later sysctl file overrides" in rep.detail


def test_kernel_without_numa_balancing_is_ok(tmp_path):
    sim, ctx = make(tmp_path, ["no_numa_balancing"])
    res = numa(ctx, "apply").steps[0]
    assert res.status == "ok" and "no NUMA balancing" in res.detail
    assert not sim.hpath(KNOB).exists()


def test_bad_inventory_value_is_bad_input(tmp_path):
    sim = build(tmp_path / "box", [], gpus=1)
    sim.inventory_extra["host"]["gpubox_numa_balancing"] = "off"
    sim.write_inventory()
    r = subprocess.run(
        [sys.executable, "-m", "gpubox.cli", "-i", str(sim.inventory_path), "tune", "numa", "ct200"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "gpubox_numa_balancing = 'off'" in r.stderr
