"""pcie-link: a GPU link held below the speed both ends support by a register (the port's Target
Link Speed, the GPU's Hardware Autonomous Speed Disable) is a finding with a retrain; a link that is
merely slow at idle is not. Read with the REAL setpci from a simulated sysfs."""

import struct

import pytest

from gpubox.context import Context
from gpubox.hwtune.pcie import SetpciAnswer, parse_regs, upstream_port
from gpubox.hwtune.pcie_link_step import PcieLinkStep
from gpubox.inventory import Inventory
from gpubox.simbox import build
from gpubox.simbox.pci import CAP_EXP, ROOT_PORT

GPU = "0000:17:00.0"  # the simulated box's first GPU, below ROOT_PORT


def _patch(sim, bdf, off, value):
    p = sim.hpath(f"/sys/bus/pci/devices/{bdf}/config")
    b = bytearray(p.read_bytes())
    struct.pack_into("<H", b, CAP_EXP + off, value)
    p.write_bytes(bytes(b))


def _decide(sim):
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv)
    try:
        step = PcieLinkStep()
        return step.decide(step.gather(ctx), step.options(ctx))
    finally:
        ctx.close()


@pytest.mark.parametrize(
    "port_target, gpu_lnkctl2, status, words",
    [
        # the port targets Gen1: the link cannot train higher, whatever the load
        (
            0x0001,
            0x0005,
            "failed",
            ["targets Gen1", f"setpci -s {ROOT_PORT} CAP_EXP+30.w=5:f", "CAP_EXP+10.w=20:20"],
        ),
        # the GPU may not change its speed itself: stuck at Gen1
        (
            0x0005,
            0x0025,
            "failed",
            ["Hardware Autonomous Speed Disable", f"setpci -s {GPU} CAP_EXP+30.w=0:20"],
        ),
        # nothing holds it: an idle GPU's own choice, no alarm
        (0x0005, 0x0005, "ok", ["normal at idle"]),
    ],
)
def test_a_held_link_is_named_with_its_port_and_retrain(tmp_path, port_target, gpu_lnkctl2, status, words):
    sim = build(tmp_path / "box", (), gpus=1)
    _patch(sim, GPU, 0x12, 0x1101)  # LnkSta: Gen1 x16
    _patch(sim, GPU, 0x30, gpu_lnkctl2)
    _patch(sim, ROOT_PORT, 0x30, port_target)
    f = _decide(sim)
    assert f.status == status, f.detail
    text = " ".join(filter(None, [f.detail, f.cause, f.repair]))
    for w in words:
        assert w in text, (w, text)


def test_upstream_port_is_the_bridge_whose_secondary_bus_is_the_gpus():
    bridges = {"0000:00:01.1": 0x17, "0000:00:03.1": 0x3D, "0001:00:01.0": 0x17}
    assert upstream_port(bridges, "0000:17:00.0") == "0000:00:01.1"
    assert upstream_port(bridges, "0001:17:00.0") == "0001:00:01.0"
    assert upstream_port(bridges, "0000:63:00.0") is None


@pytest.mark.parametrize("flags, want", [("0002", 0x25), ("0012", 0x25), ("0001", None), ("ffff", None)])
def test_lnkctl2_is_read_only_from_capability_version_2(flags, want):
    regs = parse_regs(SetpciAnswer("h", 0, f"5136 00408d05 1102 {flags} 0025\n", ""), GPU)
    assert regs["lnkctl2"] == want
