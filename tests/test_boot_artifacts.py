"""Boot artifacts (issue 38): the MRRS unit writes only the functions recorded at install; every
program a unit, udev rule or hookscript runs is read back out of its text and checked on the host
(an artifact naming a missing one is refused, at install and by doctor); no unit waits on the
deprecated systemd-udev-settle."""

from __future__ import annotations

import shutil
import struct
from types import SimpleNamespace

import pytest

from gpubox.bootbins import programs
from gpubox.context import Context
from gpubox.hwtune import steps as tune_steps
from gpubox.hwtune.pcie import SETPCI, UNIT_PATH, unit_text
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.provision import autostart, lxc
from gpubox.provision.host_devices_step import HostDevicesStep
from gpubox.simbox import build
from gpubox.simbox.pci import CAP_EXP
from gpubox.simbox.reboot import mrrs_unit_run

ID = "10de:2bb5:0302"


@pytest.mark.parametrize(
    "text, want",
    [
        (
            "[Service]\nExecStart=/usr/bin/setpci -s 0000:17:00.0 X\nExecStart=-/usr/bin/setpci -s b Y\n",
            [SETPCI],
        ),
        (
            "ExecStartPre=!/usr/sbin/foo a\nExecStop=/bin/true\n# ExecStart=/not/this\n",
            ["/usr/sbin/foo", "/bin/true"],
        ),
        (
            'ACTION=="add", KERNEL=="nvidia", RUN+="/usr/bin/nvidia-modprobe -c0 -c255"\n',
            ["/usr/bin/nvidia-modprobe"],
        ),
        ('PROGRAM=="/lib/udev/x %k", IMPORT{program}=="/usr/lib/y"\n', ["/lib/udev/x", "/usr/lib/y"]),
        (
            "#!/bin/sh\n# exec /not/this\nexec /usr/bin/env A=1 /usr/local/bin/gpubox\n",
            ["/bin/sh", "/usr/bin/env"],
        ),
        ("ExecStart=gpubox relative\n", []),
    ],
)
def test_programs_are_read_out_of_the_artifact(text, want):
    assert programs(text) == want


def _spec():
    box = SimpleNamespace(name="ct200", vmid=200, var=lambda k, d=None: d)
    return autostart.spec_from(box)


def _artifacts() -> dict[str, str]:
    s = _spec()
    return {
        "mrrs unit": unit_text([("0000:17:00.0", ID)], 5),
        **{f"persist {p}": t for p, t in lxc.persist_files(2, ["/dev/nvidia-modeset"]).items()},
        "autostart unit": autostart.render_unit(s),
        "autostart hookscript": autostart.render_snippet(s, None, None),
    }


def test_no_unit_waits_on_udev_settle():
    for name, text in _artifacts().items():
        assert "udev-settle" not in text, name


def test_each_artifact_runs_only_programs_its_step_checks():
    """What the steps check is what the texts name (bootbins.programs of the very text): a new
    program in a unit is checked without anyone listing it."""
    arts = _artifacts()
    assert programs(arts["mrrs unit"]) == [SETPCI]
    assert programs(arts[f"persist {lxc.UDEV_RULE}"]) == ["/usr/bin/nvidia-modprobe"]
    assert programs(arts["autostart unit"]) == [_spec().gpubox]
    assert programs(arts["autostart hookscript"]) == ["/bin/sh", "/usr/bin/env"]


def _ctx(sim, **options):
    inv = Inventory(sim.inventory_path)
    return Context(box=inv.box("ct200"), inventory=inv, options=options)


def test_a_missing_program_is_named_by_doctor_and_its_artifact_never_written(tmp_path):
    sim = build(tmp_path / "box", ["mrrs_512", "uvm_missing"], gpus=2)
    sim.hpath(SETPCI).unlink()
    sim.hpath("/usr/bin/nvidia-modprobe").unlink()
    ctx = _ctx(sim, persist=True)
    rep = run_steps(ctx, [HostDevicesStep(), *tune_steps(ctx, ("pcie-mrrs",))], "apply")
    st = {s.name: s for s in rep.steps}
    # the live repairs still ran; the boot files that would fail at every boot were not written
    assert st["pcie-mrrs"].status == "failed", st["pcie-mrrs"].detail
    assert f"would run {SETPCI}, not on the host" in st["pcie-mrrs"].detail
    assert "apt install pciutils" in st["pcie-mrrs"].repair
    assert not sim.hpath(UNIT_PATH).exists()
    assert st["host-devices"].status == "failed", st["host-devices"].detail
    assert "would run /usr/bin/nvidia-modprobe, not on the host" in st["host-devices"].detail
    assert not sim.hpath(lxc.UDEV_RULE).exists()
    assert sim.hpath("/dev/nvidia-uvm").exists()  # the node itself was made now


@pytest.mark.skipif(not shutil.which("setpci"), reason="needs pciutils")
def test_the_mrrs_unit_writes_only_the_functions_recorded_at_install(tmp_path):
    """After a hardware change the address of a recorded GPU holds another device: the unit (run by
    the real setpci on the simulated sysfs) leaves it alone and says so in its journal."""
    sim = build(tmp_path / "box", (), gpus=2)  # healthy: the unit is installed, recording both GPUs
    text = sim.hpath(UNIT_PATH).read_text()
    a, b = "0000:17:00.0", "0000:3d:00.0"
    assert f"-s {b} -d {ID} " in text
    for bdf in (a, b):  # firmware default back after the reboot
        cfg = sim.hpath(f"/sys/bus/pci/devices/{bdf}/config")
        buf = bytearray(cfg.read_bytes())
        struct.pack_into("<H", buf, CAP_EXP + 8, 0x2136)
        if bdf == b:  # and another card now sits at b (a different device id)
            struct.pack_into("<H", buf, 2, 0x2330)
            sim.hpath(f"/sys/bus/pci/devices/{bdf}/device").write_text("0x2330\n")
        cfg.write_bytes(bytes(buf))
    log = mrrs_unit_run(sim, text)
    dev = {
        bdf: struct.unpack_from(
            "<H", sim.hpath(f"/sys/bus/pci/devices/{bdf}/config").read_bytes(), CAP_EXP + 8
        )[0]
        for bdf in (a, b)
    }
    assert dev[a] == 0x5136  # the recorded GPU: MaxReadReq 4096, nothing else moved
    assert dev[b] == 0x2136  # the other device: untouched
    assert any("No devices selected" in line for line in log), log
