"""No repair that can make a start fail later (issue 38 item 2): an optional node (nvidia-modeset,
nvidia-caps) becomes a `devN` entry only when the host's boot files create it at every boot; a
`devN` entry the config already has makes host-devices persist that node's creation, and doctor
checks it. A devN entry whose node a boot does not create stops the start (pve-container
src/PVE/LXC.pm: "Device ... does not exist")."""

from __future__ import annotations

import json

import pytest
import yaml

from gpubox.provision.confedit import decide
from gpubox.provision.devices import read_host_devices
from gpubox.provision.lxc import UDEV_RULE, persist_files
from gpubox.provision.lxcconf import LxcConf
from gpubox.provision.nodehints import boot_created
from gpubox.simbox import build
from tests.clirun import gpubox
from tests.lxc_fakehost import fake_host

DEVN = (
    "arch: amd64\n"
    "dev0: /dev/nvidia0,mode=0666\n"
    "dev1: /dev/nvidia1,mode=0666\n"
    "dev2: /dev/nvidiactl,mode=0666\n"
    "dev3: /dev/nvidia-uvm,mode=0666\n"
    "dev4: /dev/nvidia-uvm-tools,mode=0666\n"
    "hostname: ct\n"
)
MODESET = "dev5: /dev/nvidia-modeset,mode=0666\n"


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture
def hd(tmp_path):
    from gpubox.simbox.lxc import mknod

    host = fake_host(tmp_path / "pve1")
    mknod(tmp_path / "pve1/dev/nvidia-modeset", 195, 254)
    return read_host_devices(host, 2)


def test_a_healthy_devn_config_without_modeset_is_ok_and_says_it_is_left_out(hd):
    rev = decide(LxcConf.parse(DEVN), hd)
    assert not rev.changed and rev.issues == []
    assert any(w.startswith("/dev/nvidia-modeset is left out") for w in rev.warnings)


def test_modeset_becomes_devn_only_where_every_boot_creates_it(hd):
    rule = persist_files(2, ["/dev/nvidia-modeset"])[UDEV_RULE]
    assert boot_created(rule) == {"/dev/nvidia-modeset"}
    assert boot_created(persist_files(2)[UDEV_RULE]) == frozenset()
    assert boot_created('# RUN+="/usr/bin/nvidia-modprobe -m"\n') == frozenset()  # a comment
    hd.at_boot = boot_created(rule)
    rev = decide(LxcConf.parse(DEVN), hd)
    assert "dev5: /dev/nvidia-modeset,mode=0666\n" in rev.new
    assert [i.kind for i in rev.issues] == ["missing-devN"]


def _sim(tmp_path, conf_main: str):
    sim = build(tmp_path / "box", [], gpus=2)
    conf = sim.hpath("/etc/pve/lxc/200.conf")
    conf.write_text(conf_main)
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_device_mode"] = "devN"
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    return sim


def _steps(capsys, sim, *args):
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", *args, "ct200", "--json")
    return rc, {s["name"]: s for s in json.loads(out)["steps"]}


def test_doctor_on_a_simulated_box_says_modeset_is_left_out_and_fix_adds_no_devn(tmp_path, capsys):
    sim = _sim(tmp_path, DEVN)
    rc, steps = _steps(capsys, sim, "check")
    cc = steps["container-config"]
    assert cc["status"] == "ok" and "/dev/nvidia-modeset is left out" in cc["detail"], cc
    rc, steps = _steps(capsys, sim, "fix", "--yes")
    assert "nvidia-modeset" not in sim.hpath("/etc/pve/lxc/200.conf").read_text()


def test_a_devn_modeset_entry_gets_its_boot_persistence_and_doctor_checks_it(tmp_path, capsys):
    sim = _sim(tmp_path, DEVN + MODESET)
    rc, steps = _steps(capsys, sim, "check")
    hd = steps["host-devices"]
    assert hd["status"] == "drift" and f"boot persistence missing: {UDEV_RULE}" in hd["detail"], hd
    rc, steps = _steps(capsys, sim, "fix", "--yes")
    assert steps["host-devices"]["status"] == "fixed", steps["host-devices"]
    rule = sim.hpath(UDEV_RULE).read_text()
    assert boot_created(rule) == {"/dev/nvidia-modeset"} and "nvidia-modprobe -m" in rule
    rc, steps = _steps(capsys, sim, "check")
    assert steps["host-devices"]["status"] == "ok" and steps["container-config"]["status"] == "ok"
    assert MODESET in sim.hpath("/etc/pve/lxc/200.conf").read_text()
