"""A dry run shows what apply does (issue 29, point 1): the uvm major that only nvidia-modprobe
makes known is shown as such, and apply checks that it wrote the plan the dry run showed."""

from __future__ import annotations

import json

import pytest

from gpubox.context import Context
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.provision.devices import UVM_PENDING, predicted_dynamic_major
from gpubox.provision.lxc_step import ContainerConfigStep, HostDevicesStep
from gpubox.simbox import build
from tests.clirun import gpubox

RULE_PENDING = f"+lxc.cgroup2.devices.allow: c {UVM_PENDING}:* rwm"


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "400")


def _steps(doc):
    return {s["name"]: s for s in doc["steps"]}


def _recover(capsys, sim, *args):
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--no-bench", "--json", *args)
    return rc, json.loads(out)


def test_seed_box_dry_run_shows_the_rule_apply_writes(tmp_path, capsys):
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major"], gpus=2)
    rc, dry = _recover(capsys, sim, "--dry-run")
    shown = _steps(dry)["container-config"]
    # the stale rule is replaced, not deleted: the new line names the major as what it is
    assert "-lxc.cgroup2.devices.allow: c 508:* rwm\n" + RULE_PENDING in shown["diff"]
    assert "predicted 511" in shown["detail"]  # the kernel's rule over this host's /proc/devices
    conf = sim.hpath("/etc/pve/lxc/200.conf").read_text()

    rc, done = _recover(capsys, sim, "--yes")
    assert rc == 0, done
    applied = _steps(done)["container-config"]
    assert applied["status"] == "fixed" and "as planned" in applied["detail"]
    # apply wrote exactly the dry run's diff with the placeholder replaced by the major read
    assert applied["diff"] == shown["diff"].replace(UVM_PENDING, "511")
    assert "c 511:* rwm" in sim.hpath("/etc/pve/lxc/200.conf").read_text() != conf


def test_apply_refuses_a_plan_that_is_not_the_one_shown(tmp_path):
    """The host (here: the config) changes between host-devices' modprobe and the rewrite: the
    rewrite is no longer the plan shown before the modprobe, so nothing is written."""
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major"], gpus=2)
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv, options={"yes": True, "persist": True})
    run_steps(ctx, [HostDevicesStep()], "apply")
    path = sim.hpath("/etc/pve/lxc/200.conf")
    path.write_text(path.read_text().replace("cores: ", "cores: 1", 1))
    ctx.forget()
    f = ContainerConfigStep().check(ctx)
    assert f.status == "failed" and "not the one the plan showed" in f.detail
    assert "c 508:* rwm" in path.read_text()  # untouched


def test_skipping_host_devices_never_writes_the_placeholder(tmp_path, capsys):
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major"], gpus=2)
    before = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    rc, doc = _recover(capsys, sim, "--yes", "--skip", "host-devices")
    cc = _steps(doc)["container-config"]
    assert rc == 1 and cc["status"] == "failed" and "not known yet" in cc["detail"]
    assert sim.hpath("/etc/pve/lxc/200.conf").read_text() == before


def test_predicted_major_follows_the_kernel_rule():
    assert predicted_dynamic_major(set()) == 254
    assert predicted_dynamic_major(set(range(234, 255))) == 511
    assert predicted_dynamic_major(set(range(234, 255)) | {511, 510}) == 509
    assert predicted_dynamic_major(set(range(234, 255)) | set(range(384, 512))) is None
