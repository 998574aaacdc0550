"""Units of the issue-28 diagnoses: the expected-GPU shortfall, the kernel-module reader, the
devN-required nodes, the toolkit config reader, ACS read with the real setpci on the simulated
box's sysfs, and no alarm on the recorded healthy H200 documents."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpubox.host import Host
from gpubox.hwtune import probe_verdict
from gpubox.hwtune.acs import AcsRead, decide
from gpubox.inventory import HostEntry
from gpubox.provision.devices import DeviceScan
from gpubox.provision.gpucheck import GpuPresence, shortfall
from gpubox.provision.host_devices_step import HostDevicesFacts, HostDevicesOptions, HostDevicesStep
from gpubox.provision.hostdiag import KernelModulesFact, driver_not_loaded
from gpubox.provision.nodehints import devn_paths
from gpubox.provision.toolkit import no_cgroups
from gpubox.transport.local import LocalTransport

FIX = Path(__file__).parent / "fixtures" / "probe"


def _host(root: Path) -> Host:
    return Host(HostEntry("h", {"gpubox_root": str(root)}), LocalTransport("h"))


def test_shortfall_names_gone_and_unbound_gpus():
    p = GpuPresence(["0000:17:00.0"], ["0000:17:00.0", "0000:3d:00.0"], ["0000:17:00.0", "0000:e9:00.0"])
    s = shortfall(p, 3)
    assert (s.seen, s.want) == (1, 3)
    assert set(s.missing) == {"0000:3d:00.0", "0000:e9:00.0"}
    assert "1 of 3 GPUs" in s.detail and "gone from the PCI bus" in s.detail


def test_shortfall_counts_unnamed_gpus_and_stays_quiet_when_whole():
    assert "2 more not identified" in shortfall(GpuPresence(["0000:01:00.0"], ["0000:01:00.0"]), 3).detail
    assert shortfall(GpuPresence(["0000:01:00.0"], ["0000:01:00.0"], ["0000:01:00.0"]), 1) is None
    assert shortfall(GpuPresence(None, None), 8) is None  # nothing read: no claim


def _h200_scan(n: int, bus: list[str]) -> HostDevicesFacts:
    proc = (FIX / "h200_proc_devices").read_text()
    stats = {f"/dev/nvidia{i}": [True, [195, i]] for i in range(n)}
    stats.update({"/dev/nvidiactl": [True, [195, 255]], "/dev/nvidia-uvm": [True, [238, 0]]})
    stats.update({"/dev/nvidia-uvm-tools": [True, [238, 1]], "/dev/nvidia-modeset": None})
    return HostDevicesFacts(DeviceScan(proc, n, [], stats), presence=GpuPresence(bus, bus, []))


@pytest.mark.parametrize("doc", ["h200_real.json", "h200x2_nvswitch/probe.json"])
def test_recorded_healthy_h200_boxes_raise_no_alarm(doc):
    d = json.loads((FIX / doc).read_text())
    bus = [g["bus_id"] for g in d["nvml"]["gpus"]]
    f = HostDevicesStep().decide(_h200_scan(len(bus), bus), HostDevicesOptions(expect_gpus=len(bus)))
    assert f.status == "ok", f.detail
    # the fabric state each kind reads: 1x NOT_SUPPORTED (FACTS of the device machine), 2x NVSwitch completed
    state = "not_supported" if len(bus) == 1 else "completed"
    for g in d["nvml"]["gpus"]:
        g["fabric"] = {"state": state, "status": 0, "clique": 0, "health_mask": 0}
    checks = probe_verdict.decide(d, expect_gpus=len(bus))
    fab = [c for c in checks if c.name == "fabric"]
    assert fab and fab[0].status == "ok", fab
    assert not [c for c in checks if c.status in ("failed", "drift")], [(c.name, c.detail) for c in checks]


def test_kernel_module_reader_on_a_fake_root(tmp_path):
    (tmp_path / "proc/sys/kernel").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.8.12-9-pve\n")
    old = tmp_path / "lib/modules/6.8.12-4-pve/updates/dkms"
    old.mkdir(parents=True)
    (old / "nvidia.ko").write_bytes(b"")
    (tmp_path / "lib/modules/6.8.12-9-pve").mkdir(parents=True)
    (tmp_path / "var/lib/dkms/nvidia/580.95.05/6.8.12-4-pve").mkdir(parents=True)
    k = KernelModulesFact.read(_host(tmp_path))
    assert (k.release, k.module, k.headers, k.others) == ("6.8.12-9-pve", None, False, ["6.8.12-4-pve"])
    assert k.dkms == ["580.95.05/6.8.12-4-pve"]
    detail, cause, repair, _ = driver_not_loaded(k)
    assert "6.8.12-9-pve has no NVIDIA module" in detail and "headers are not installed" in cause
    assert "proxmox-headers-6.8.12-9-pve" in repair


def test_devn_paths_only_from_the_main_section():
    conf = "arch: amd64\ndev0: /dev/nvidia0,mode=0666\ndev1: /dev/dri/renderD128\ndev2: /dev/nvidia-modeset\n"
    conf += "\n[snap]\ndev3: /dev/nvidia-uvm\n"
    assert devn_paths(conf) == ["/dev/nvidia0", "/dev/nvidia-modeset"]


def test_no_cgroups_reader():
    assert no_cgroups("[nvidia-container-cli]\n#no-cgroups = false\n") is None
    assert no_cgroups("[nvidia-container-cli]\nno-cgroups = true # LXC\n") is True
    assert no_cgroups("[other]\nno-cgroups = true\n[nvidia-container-cli]\nno-cgroups = false\n") is False


@pytest.mark.skipif(shutil.which("setpci") is None, reason="pciutils not installed")
def test_acs_read_with_real_setpci_on_the_simulated_sysfs(tmp_path):
    from gpubox.simbox import build

    sim = build(tmp_path / "box", ["acs_redirect"])
    facts = AcsRead.read(_host(sim.host_root))
    root = [b for b in facts.bridges if b.bdf == "0000:00:01.1"]
    assert root and root[0].acsctl == 0x001D and root[0].port_type == 4
    assert facts.iommu["0000:17:00.0"] == "DMA"
    assert decide(facts).status == "failed"
    healthy = build(tmp_path / "ok", [])
    f = decide(AcsRead.read(_host(healthy.host_root)))
    assert f.status == "ok" and "none with ACS" in f.detail


def test_docker_rule_with_a_hard_coded_uvm_major_is_named():
    from gpubox.provision.toolkit import ToolkitFacts
    from gpubox.provision.toolkit import decide as tk_decide

    proc = (FIX / "h200_proc_devices").read_text()  # nvidia-uvm 238 on the real H200
    stale = ToolkitFacts(None, False, {"a1b2c3d4e5f6a7b8": ["c 195:* rmw", "c 237:* rmw"]}, proc)
    status, detail, cause, repair = tk_decide(stale)
    assert status == "failed" and "c 237:* rmw" in detail and "nvidia-uvm is 238" in detail
    assert "--device /dev/nvidia-uvm" in repair
    current = ToolkitFacts(None, False, {"a1b2c3d4e5f6a7b8": ["c 195:* rmw", "c 238:* rmw"]}, proc)
    assert tk_decide(current)[0] == "ok"


def test_recorded_h200_fabric_and_power_read_raise_no_alarm():
    """The document read on the real 1x H200 for issue 28 (tests/fixtures/probe/README.md): fabric
    NOT_SUPPORTED and the power cap at its default are healthy."""
    from gpubox.hwtune.probe_topology import FABRIC_STATES

    read = json.loads((FIX / "h200_i28_fabric_power.json").read_text())
    g = read["gpus"][0]
    assert g["fabric_v2"]["state"] == 0 and g["power_limit_mw"] == g["power_default_mw"]
    doc = json.loads((FIX / "h200_real.json").read_text())
    gd = doc["nvml"]["gpus"][0]
    gd["fabric"] = {
        "state": FABRIC_STATES[g["fabric_v2"]["state"]],
        "status": g["fabric_v2"]["status"],
        "clique": g["fabric_v2"]["clique"],
        "health_mask": g["fabric_v2"]["health_mask"],
    }
    gd["power_limit_w"], gd["power_default_w"] = g["power_limit_mw"] / 1000, g["power_default_mw"] / 1000
    gd["app_clocks_mhz"] = {
        "sm": g["app_clock_sm"],
        "sm_default": g["default_app_clock_sm"],
        "mem": g["app_clock_mem"],
        "mem_default": g["default_app_clock_mem"],
    }
    checks = probe_verdict.decide(doc, expect_gpus=1)
    assert [c.status for c in checks if c.name == "fabric"] == ["ok"]
    assert not [c for c in checks if c.status in ("failed", "drift")], [(c.name, c.detail) for c in checks]


def test_lowered_application_clocks_are_named():
    doc = json.loads((FIX / "h200_real.json").read_text())
    doc["nvml"]["gpus"][0]["app_clocks_mhz"] = {
        "sm": 1410,
        "sm_default": 1980,
        "mem": 3201,
        "mem_default": 3201,
    }
    bad = [c for c in probe_verdict.decide(doc, expect_gpus=1) if c.status != "ok" and c.status != "skipped"]
    assert [c.name for c in bad] == ["gpu0 state"] and "sm 1410 MHz (default 1980)" in bad[0].detail
    assert "-rac" in bad[0].repair
