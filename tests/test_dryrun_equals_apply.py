"""A dry run shows what apply does (issue 29, point 1): the uvm major that only nvidia-modprobe
makes known is shown as such, and apply checks that it wrote the plan the dry run showed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubox.context import Context
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.provision.container_config_step import ContainerConfigStep
from gpubox.provision.devices import UVM_PENDING, predicted_dynamic_major
from gpubox.provision.host_devices_step import HostDevicesStep
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


# -- real inputs: the real H200 /proc/devices, real container configs from public sources ---------
REAL = Path(__file__).parent / "fixtures"
H200_DEVICES = (REAL / "probe" / "h200_proc_devices").read_text()  # read on the H200 device machine


def test_prediction_on_a_real_proc_devices_is_the_major_uvm_really_had():
    """The H200's /proc/devices (driver 580.159.04: nvidia-uvm 238). With the nvidia-uvm line taken
    out, as before the module loads, the kernel's rule predicts exactly 238 (the other drivers keep
    254..239)."""
    from gpubox.provision.devices import char_majors, parse_proc_devices

    assert parse_proc_devices(H200_DEVICES)["nvidia-uvm"] == 238
    without = "\n".join(l for l in H200_DEVICES.splitlines() if "nvidia-uvm" not in l)
    # every registered major counts, also 244/245, whose names 231 has too (one major per name
    # would leave them out and predict 245: found on this real file)
    assert {244, 245} <= char_majors(without)
    assert predicted_dynamic_major(set(char_majors(without))) == 238


def _scan_without_uvm(gpus: int = 1):
    from gpubox.provision.devices import DeviceScan

    proc = "\n".join(l for l in H200_DEVICES.splitlines() if "nvidia-uvm" not in l) + "\n"
    stats = {f"/dev/nvidia{i}": (True, (195, i)) for i in range(gpus)}
    stats.update(
        {"/dev/nvidiactl": (True, (195, 255)), "/dev/nvidia-uvm": None, "/dev/nvidia-uvm-tools": None}
    )
    return DeviceScan(proc, gpus, [], stats)


REALWORLD = sorted((REAL / "lxc" / "realworld").glob("*.conf"))


@pytest.mark.parametrize("conf", REALWORLD, ids=[p.stem for p in REALWORLD])
def test_real_configs_never_plan_the_uvm_rule_away(conf):
    """Every real config (public sources, provenance in its .source file), on a host where
    nvidia-uvm is not loaded yet: the dry run never deletes an NVIDIA uvm rule without adding the
    rule at the major read after modprobe, never writes a number for that major, and apply would
    refuse the placeholder if host-devices did not run first."""
    from gpubox.provision.container_config_step import ConfigFacts, ConfigOptions
    from gpubox.provision.devices import host_devices
    from gpubox.provision.lxc import referenced_paths

    text = conf.read_text(errors="replace")
    scan = _scan_without_uvm()
    rdev = {p: None for p in referenced_paths(text, host_devices(scan))}
    for i in range(scan.gpus):
        rdev[f"/dev/nvidia{i}"] = ("c", 195, i)
    rdev["/dev/nvidiactl"] = ("c", 195, 255)
    f = ContainerConfigStep().decide(ConfigFacts(text, scan, rdev, []), ConfigOptions(200))
    diff = f.plan.diff if f.plan else ""
    added = [l for l in diff.splitlines() if l.startswith("+lxc.cgroup2.devices.allow")]
    for l in added:
        assert "238" not in l and "511" not in l, l  # the uvm major is never guessed into the file
    if UVM_PENDING in diff:
        assert any(UVM_PENDING in l for l in added)
        assert "predicted 238" in f.detail
