"""The PCIe data cases built from real `lspci -vvv` samples carry the registers those samples show.

Each case under tests/steps/pcie-*/ that names a "sample" (tests/fixtures/pcie/realworld/, see its
PROVENANCE.md) has its DevCtl/LnkCap/LnkSta words written into a simulated function's config space;
the REAL lspci must then print the sample's DevCtl and link lines. So the facts a case decides on
are the sample's, as pciutils reads them, not our own decoding of them.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gpubox.hwtune.pcie import DeviceRegs
from gpubox.simbox import build
from gpubox.simbox.pci import CAP_EXP
from tests.stepcases import ROOT as STEPS

pytestmark = pytest.mark.skipif(not shutil.which("lspci"), reason="needs pciutils")

REPO = Path(__file__).resolve().parent.parent
CASES = [p for p in sorted(STEPS.glob("pcie-*/*.json")) if "sample" in json.loads(p.read_text())]
# The lines of `lspci -vvv` that come from DevCtl, LnkCap and LnkSta.
LINES = [
    r"DevCtl:\s*CorrErr[+-] NonFatalErr[+-] FatalErr[+-] UnsupReq[+-]",
    r"RlxdOrd[+-] ExtTag[+-] PhantFunc[+-] AuxPwr[+-] NoSnoop[+-]",
    r"MaxPayload \d+ bytes, MaxReadReq \d+ bytes",
    r"LnkCap:\s*Port #\d+, Speed [0-9.]+GT/s, Width x\d+",
    r"LnkSta:\s*Speed [0-9.]+GT/s(?: \(\w+\))?, Width x\d+(?: \(\w+\))?",
]


def _norm(s: str) -> str:
    return " ".join(s.replace(" (ok)", "").split())


def _lines(text: str) -> dict[str, str]:
    out = {}
    for pat in LINES:
        m = re.search(pat, text)
        if m:
            out[pat] = _norm(m.group(0))
    return out


def test_there_are_realworld_pcie_cases():
    assert len(CASES) >= 3


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_registers_print_as_the_real_sample(tmp_path, path):
    case = json.loads(path.read_text())
    sample = (REPO / case["sample"]).read_text()
    want = _lines(sample)
    assert want, f"{case['sample']} has no DevCtl/LnkCap/LnkSta line"
    (dev,) = [DeviceRegs(**d) for d in case["facts"]["devices"]]  # one function per sample
    sim = build(tmp_path / "box", (), gpus=1)
    bdf = "0000:17:00.0"
    cfg = sim.hpath(f"/sys/bus/pci/devices/{bdf}/config")
    b = bytearray(cfg.read_bytes())
    struct.pack_into("<H", b, CAP_EXP + 8, dev.devctl)
    struct.pack_into("<I", b, CAP_EXP + 0x0C, dev.lnkcap)
    struct.pack_into("<H", b, CAP_EXP + 0x12, dev.lnksta)
    cfg.write_bytes(bytes(b))
    r = subprocess.run(
        ["lspci", "-vvv", "-A", "linux-sysfs", "-O", f"sysfs.path={sim.hpath('/sys/bus/pci')}", "-s", bdf],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    got = _lines(r.stdout)
    assert {k: got.get(k) for k in want} == want, r.stdout
