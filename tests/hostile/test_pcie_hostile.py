"""Config space that does not read back sanely is never written to, and `tune check` says so.

Real setpci against a simulated sysfs whose `config` bytes are made hostile: all-ones (what a
function that fell off the bus returns), truncated files, DevCtl with bit 15 (Initiate FLR, which
always reads 0) or a reserved MPS/MRRS code (6, 7). Damage = any config byte changed.
"""

from __future__ import annotations

import shutil
import struct

import pytest

from gpubox.simbox import build
from gpubox.simbox.pci import CAP_EXP
from tests.clirun import gpubox

pytestmark = pytest.mark.skipif(not shutil.which("setpci"), reason="needs pciutils")

BDF = "0000:3d:00.0"


def _devctl(word):
    def f(cfg: bytes) -> bytes:
        b = bytearray(cfg)
        struct.pack_into("<H", b, CAP_EXP + 8, word)
        return bytes(b)

    return f


CASES = {
    "all_ones_4096": lambda cfg: b"\xff" * 4096,
    "all_ones_256": lambda cfg: b"\xff" * 256,
    "truncated_0": lambda cfg: b"",
    "truncated_32": lambda cfg: cfg[:32],
    "truncated_at_devctl": lambda cfg: cfg[: CAP_EXP + 8],
    "truncated_after_devctl": lambda cfg: cfg[: CAP_EXP + 10],
    "truncated_mid_link": lambda cfg: cfg[: CAP_EXP + 0x0E],
    "devctl_ffff": _devctl(0xFFFF),
    "devctl_flr_bit": _devctl(0x8000 | 0x2136),
    "devctl_mrrs_6": _devctl(0x6136),
    "devctl_mrrs_7": _devctl(0x7136),
    "devctl_mps_6": _devctl(0x20D6),
    "devctl_mps_7": _devctl(0x20F6),
}


def _configs(sim):
    root = sim.hpath("/sys/bus/pci/devices")
    return {d.name: (d / "config").read_bytes() for d in sorted(root.iterdir())}


@pytest.mark.parametrize("case", list(CASES))
def test_unsane_function_is_never_written_and_check_is_not_ok(tmp_path, capsys, case):
    sim = build(tmp_path / "box", ("mrrs_512",), gpus=2)
    cfg = sim.hpath(f"/sys/bus/pci/devices/{BDF}/config")
    cfg.write_bytes(CASES[case](cfg.read_bytes()))
    before = _configs(sim)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "pcie", "ct200", "--json")
    assert "Traceback" not in err and "internal error" not in err, err
    assert _configs(sim)[BDF] == before[BDF], "DAMAGE: wrote to a function that does not read back sanely"
    assert rc in (1, 2), out
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "check", "ct200")
    assert rc != 0 and "internal error" not in err, out + err


@pytest.mark.parametrize("bad", ["nonsense", "0000:99:00.0", "../..", "audio,zzz", "\x1b[31m"])
def test_include_bad_exits_2_before_anything(tmp_path, capsys, bad):
    sim = build(tmp_path / "box", ("mrrs_512",), gpus=2)
    before = _configs(sim)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "pcie", "ct200", "--include", bad)
    assert rc == 2 and err.count("\n") == 1 and "--include" in err, out + err
    assert _configs(sim) == before, "DAMAGE: config space changed"
