"""A GPU that fell off the bus is a failure, never the new normal (issue 28).

On the simulated 8-GPU box whose last GPU is gone after the reboot (`--fault gpu_lost`: PCI
functions removed, the driver holds 7, the inventory says 8): doctor exits 1 naming "7 of 8" and
the missing bus id; `recover --yes` does not end ok, restarts nothing and leaves the boot
persistence written for 8 GPUs byte-identical.
"""

from __future__ import annotations

import json

from gpubox.simbox import all_faults, build
from tests.clirun import gpubox

LOST = "0000:e9:00.0"  # the 8th GPU of the simulated board (simbox.pci.BUSES)
UNIT = "etc/systemd/system/gpubox-pcie-mrrs.service"
UDEV = "etc/udev/rules.d/70-nvidia-uvm.rules"
MODULES = "etc/modules-load.d/nvidia-uvm.conf"


def _steps(doc):
    return {s["name"]: s for s in doc["steps"]}


def test_fault_is_listed():
    assert "gpu_lost" in all_faults()


def test_doctor_names_seven_of_eight_and_the_bus_id(tmp_path, capsys):
    sim = build(tmp_path / "box", ["gpu_lost"])
    rc, out, _ = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200", "--json")
    assert rc == 1
    steps = _steps(json.loads(out))
    hd = steps["host-devices"]
    assert hd["status"] == "failed"
    assert "7 of 8" in hd["detail"] and LOST in hd["detail"]
    assert "Xid 79" in hd["repair"] and "reseat" in hd["repair"]
    assert steps["cuda"]["status"] == "failed" and "7 of 8" in steps["cuda"]["detail"]
    assert steps["pcie-mrrs"]["status"] == "failed" and LOST in steps["pcie-mrrs"]["detail"]


def test_recover_keeps_persistence_for_eight_and_restarts_nothing(tmp_path, capsys):
    sim = build(tmp_path / "box", ["gpu_lost"])
    files = {p: (sim.host_root / p).read_bytes() for p in (UNIT, UDEV, MODULES)}
    assert files[UNIT].count(b"ExecStart=") == 8 and LOST.encode() in files[UNIT]
    calls_before = len(sim.calls())
    rc, out, _ = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--json", "--no-bench")
    doc = json.loads(out)
    assert rc == 1 and doc["ok"] is False
    steps = _steps(doc)
    assert steps["host-devices"]["status"] == "failed"
    assert steps["container"]["status"] == "skipped"  # blocked: no restart "fixes" a lost GPU
    assert {p: (sim.host_root / p).read_bytes() for p in files} == files
    new = sim.calls()[calls_before:]
    assert not [c for c in new if c["cmd"] == "pct" and c["argv"][:1] in (["start"], ["reboot"], ["stop"])]
    assert not [c for c in new if c["cmd"] in ("nvidia-modprobe", "systemctl") and "enable" in c["argv"]]


def test_healthy_box_is_not_flagged(tmp_path, capsys):
    sim = build(tmp_path / "box", [])
    rc, out, _ = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200", "--json", "--skip", "bench")
    steps = _steps(json.loads(out))
    assert steps["host-devices"]["status"] == "ok", steps["host-devices"]
    assert steps["cuda"]["status"] == "ok" and steps["pcie-mrrs"]["status"] == "ok"


def test_devn_required_modeset_is_created_by_host_devices(tmp_path, capsys):
    """A `devN: /dev/nvidia-modeset` entry on a host whose driver no longer makes that node at boot
    (remz1337/Proxmox#8): doctor names it, recover runs `nvidia-modprobe -m` and ends ok."""
    import os

    sim = build(tmp_path / "box", [])
    conf = sim.hpath("/etc/pve/lxc/200.conf")
    main, sep, rest = conf.read_text().partition("\n[")
    main = main.replace(
        "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file\n", ""
    )
    main = main.replace("features: nesting=1\n", "dev0: /dev/nvidia-modeset\nfeatures: nesting=1\n")
    conf.write_text(main + sep + rest)
    os.unlink(sim.hpath("/dev/nvidia-modeset"))
    rc, out, _ = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200", "--only", "lxc", "--json")
    hd = _steps(json.loads(out))["host-devices"]
    assert rc == 1 and hd["status"] == "drift" and "/dev/nvidia-modeset missing" in hd["detail"]
    assert "nvidia-modprobe -m" in hd["repair"]
    rc, out, _ = gpubox(
        capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--no-bench", "--only", "lxc", "--json"
    )
    assert rc == 0, out
    assert ["-m"] in [c["argv"] for c in sim.calls("nvidia-modprobe")]
    assert os.major(os.stat(sim.hpath("/dev/nvidia-modeset")).st_rdev) == 195
