"""PCIe MaxReadReq and link status against a simulated box, through the REAL setpci and lspci."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import struct
import subprocess
import sys

import pytest

from gpubox.context import Context
from gpubox.errors import GpuboxError
from gpubox.hwtune import steps
from gpubox.hwtune.pcie import UNIT, UNIT_PATH, decode_devctl, parse_mrrs, select_functions, write_argv
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.simbox import build
from gpubox.simbox.pci import CAP_EXP, NO_CAP_BDF

pytestmark = pytest.mark.skipif(
    not shutil.which("setpci") or not shutil.which("lspci"), reason="needs pciutils"
)


def make(tmp_path, faults=(), gpus=8, **options):
    sim = build(tmp_path / "box", faults, gpus=gpus)
    inv = Inventory(sim.inventory_path)
    return sim, Context(box=inv.box("ct200"), inventory=inv, options=options)


def devdir(sim, bdf):
    return sim.hpath(f"/sys/bus/pci/devices/{bdf}")


def configs(sim) -> dict[str, bytes]:
    root = sim.hpath("/sys/bus/pci/devices")
    return {d.name: (d / "config").read_bytes() for d in sorted(root.iterdir())}


def set_devctl(sim, bdf, word):
    p = devdir(sim, bdf) / "config"
    b = bytearray(p.read_bytes())
    struct.pack_into("<H", b, CAP_EXP + 8, word)
    p.write_bytes(bytes(b))


def devctl(cfg: bytes) -> int:
    return struct.unpack_from("<H", cfg, CAP_EXP + 8)[0]


def lspci(sim, bdf) -> str:
    r = subprocess.run(
        ["lspci", "-vvv", "-A", "linux-sysfs", "-O", f"sysfs.path={sim.hpath('/sys/bus/pci')}", "-s", bdf],
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout


def cli(sim, *args):
    return subprocess.run(
        [sys.executable, "-m", "gpubox.cli", "-i", str(sim.inventory_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def pcie(ctx, mode):
    return run_steps(ctx, steps(ctx, ("pcie-mrrs",)), mode).steps[0]


# -- every starting state ends with only bits 14:12 changed ----------------------------------------
OTHER_BITS = [0x0000, 0x0917, 0x0F1F]  # none; ext tag + no snoop + err reporting; every low bit
COMBOS = list(itertools.product(range(6), range(6), OTHER_BITS))  # MRRS code x MPS code x other bits


def test_masked_write_changes_only_mrrs_bits_for_every_starting_state(tmp_path):
    sim, ctx = make(tmp_path, gpus=8)
    gpus = [f.bdf for f in select_functions(ctx.host)]
    assert len(gpus) == 8
    for batch in range(0, len(COMBOS), len(gpus)):
        words = {}
        for bdf, (mrrs, mps, other) in zip(gpus, COMBOS[batch : batch + len(gpus)]):
            words[bdf] = (mrrs << 12) | (mps << 5) | other  # bit 15 (FLR) always clear
            set_devctl(sim, bdf, words[bdf])
        before = configs(sim)
        res = pcie(ctx, "apply")
        after = configs(sim)
        assert res.status in ("fixed", "ok"), res.detail
        for name, cfg in before.items():
            if name not in words:  # audio functions and the bridge: untouched
                assert after[name] == cfg, name
                continue
            old, new = devctl(cfg), devctl(after[name])
            assert new == (old & ~0x7000) | 0x5000, f"{name}: 0x{old:04x} -> 0x{new:04x}"
            assert not new & 0x8000  # never an FLR
            diff = [i for i in range(4096) if cfg[i] != after[name][i]]
            assert all(i in (CAP_EXP + 8, CAP_EXP + 9) for i in diff), (name, diff)
    out = lspci(sim, gpus[0])
    assert "MaxReadReq 4096 bytes" in out
    assert re.search(r"MaxPayload \d+ bytes, MaxReadReq 4096 bytes", out)


def test_lspci_confirms_and_mps_and_audio_unchanged(tmp_path):
    sim, ctx = make(tmp_path, ["mrrs_512"])
    gpu, audio = "0000:17:00.0", "0000:17:00.1"
    before_gpu, before_audio = lspci(sim, gpu), lspci(sim, audio)
    assert "MaxReadReq 512 bytes" in before_gpu
    res = pcie(ctx, "apply")
    assert res.status == "fixed" and res.changed
    after_gpu, after_audio = lspci(sim, gpu), lspci(sim, audio)
    assert "MaxReadReq 4096 bytes" in after_gpu
    mps = lambda s: re.search(r"DevCtl:.*?MaxPayload (\d+) bytes", s, re.S).group(1)  # noqa: E731
    assert mps(before_gpu) == mps(after_gpu)
    assert after_audio == before_audio and "MaxReadReq 512 bytes" in after_audio
    # masked setpci writes, then (persistence is the default) the boot unit's systemctl runs
    assert {argv[0] for argv in res.commands} == {"setpci", "systemctl"}
    for argv in res.commands:
        assert argv[0] == "systemctl" or argv[-1] == "CAP_EXP+8.w=5000:7000"


def test_second_run_changes_nothing(tmp_path):
    sim, ctx = make(tmp_path, ["mrrs_512"])
    assert pcie(ctx, "apply").changed
    snap = configs(sim)
    again = run_steps(ctx, steps(ctx, ("pcie-mrrs",)), "apply")
    assert again.steps[0].status == "ok" and not again.changed and again.exit_code == 0
    assert configs(sim) == snap


def test_dry_run_shows_decode_and_argv_and_changes_nothing(tmp_path):
    sim, ctx = make(tmp_path, ["mrrs_512"])
    snap = configs(sim)
    r = cli(sim, "tune", "pcie", "ct200", "--dry-run", "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    st = {s["name"]: s for s in doc["steps"]}["pcie-mrrs"]
    assert "DevCtl 0x2936 -> 0x5936" in st["detail"] and "MaxReadReq 512 -> 4096" in st["detail"]
    assert [
        "setpci",
        "-A",
        "linux-sysfs",
        "-O",
        f"sysfs.path={sim.hpath('/sys/bus/pci')}",
        "-s",
        "0000:17:00.0",
        "CAP_EXP+8.w=5000:7000",
    ] in st["commands"]
    assert configs(sim) == snap and not doc["changed"]


def test_include_audio_tunes_audio_function_masked(tmp_path):
    sim, ctx = make(tmp_path, gpus=2, include=("audio",))
    before = configs(sim)
    res = pcie(ctx, "apply")
    assert res.status == "fixed"
    after = configs(sim)
    assert devctl(after["0000:17:00.1"]) == (devctl(before["0000:17:00.1"]) & ~0x7000) | 0x5000
    assert after["0000:17:00.0"] == before["0000:17:00.0"]  # GPU was already at 4096


@pytest.mark.parametrize("value", ["3000", "6", "-1", "8192", "64", "abc", "7"])
def test_invalid_mrrs_is_bad_input(tmp_path, value):
    sim, _ = make(tmp_path, ["mrrs_512"], gpus=1)
    snap = configs(sim)
    r = cli(sim, "tune", "pcie", "ct200", f"--mrrs={value}")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid MaxReadReq" in lines[0] and "Traceback" not in r.stderr
    assert configs(sim) == snap


def test_invalid_mrrs_in_inventory_is_bad_input(tmp_path):
    sim = build(tmp_path / "box", ["mrrs_512"], gpus=1)
    sim.inventory_extra["host"]["gpubox_pcie_mrrs"] = 3000
    sim.write_inventory()
    r = cli(sim, "tune", "pcie", "ct200")
    assert r.returncode == 2 and "invalid MaxReadReq '3000'" in r.stderr


@pytest.mark.parametrize(
    "value,code", [("4096", 5), (4096, 5), ("128", 0), ("0", 0), ("5", 5), ("0x200", 2), (1024, 3)]
)
def test_parse_mrrs_accepts_bytes_and_codes(value, code):
    assert parse_mrrs(value) == code


def test_smaller_target_is_applied_masked(tmp_path):
    sim, ctx = make(tmp_path, gpus=1, mrrs="1024")
    res = pcie(ctx, "apply")
    assert res.status == "fixed"
    assert "MaxReadReq 1024 bytes" in lspci(sim, "0000:17:00.0")


def test_device_without_pcie_capability_is_refused_clearly(tmp_path):
    sim, ctx = make(tmp_path, ["no_pcie_cap"], gpus=2)
    snap = configs(sim)
    res = pcie(ctx, "check")
    assert res.status == "failed"
    assert f"{NO_CAP_BDF} has no PCI Express capability" in res.detail
    r = cli(sim, "tune", "pcie", "ct200", "--json")
    assert r.returncode == 1 and "no PCI Express capability" in json.loads(r.stdout)["steps"][0]["detail"]
    assert configs(sim) == snap


def test_lockdown_refuses_with_clear_message_and_writes_nothing(tmp_path):
    sim, ctx = make(tmp_path, ["mrrs_512", "lockdown"], gpus=4)
    snap = configs(sim)
    res = pcie(ctx, "apply")
    assert res.status == "failed" and not res.changed
    assert "kernel lockdown (integrity)" in res.detail and "boot without lockdown" in res.repair
    assert configs(sim) == snap


def test_persist_installs_enabled_boot_unit(tmp_path):
    sim, ctx = make(tmp_path, ["mrrs_512"], gpus=4, persist=True)
    res = pcie(ctx, "apply")
    assert res.status == "fixed", res.detail
    unit = sim.hpath(UNIT_PATH).read_text()
    assert "After=systemd-modules-load.service" in unit and "Before=pve-guests.service" in unit
    assert "udev-settle" not in unit  # deprecated (systemd-udev-settle.service(8))
    execs = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    assert execs == [  # each write selects the recorded function by bus id AND vendor:device:class
        f"/usr/bin/setpci -s {b} -d 10de:2bb5:0302 CAP_EXP+8.w=5000:7000"
        for b in ("0000:17:00.0", "0000:3d:00.0", "0000:63:00.0", "0000:89:00.0")
    ]
    assert sim.read_state()["units"]["host"][UNIT]["enabled"] is True
    calls = [c["argv"] for c in sim.calls("systemctl")]
    assert ["daemon-reload"] in calls and ["enable", UNIT] in calls
    again = run_steps(ctx, steps(ctx, ("pcie-mrrs",)), "apply")
    assert again.steps[0].status == "ok" and not again.changed


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_boot_unit_passes_systemd_analyze_verify(tmp_path):
    from gpubox.hwtune.pcie import unit_text

    p = tmp_path / UNIT
    p.write_text(unit_text([("0000:17:00.0", "10de:2bb5:0302"), ("0000:2a:00.0", "10de:2330:0302")], 5))
    r = subprocess.run(["systemd-analyze", "verify", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "is not executable" not in r.stderr and "Unknown" not in r.stderr


def test_link_degraded_is_a_health_finding(tmp_path):
    sim, ctx = make(tmp_path, ["link_degraded"], gpus=4)
    rep = run_steps(ctx, steps(ctx, ("pcie-mrrs", "pcie-link")), "apply")
    st = {s.name: s for s in rep.steps}
    assert st["pcie-mrrs"].status == "ok"
    assert st["pcie-link"].status == "failed" and not st["pcie-link"].changed
    assert "0000:63:00.0 trained at Gen4 x8, capable of Gen5 x16" in st["pcie-link"].detail
    assert "Speed 16GT/s (downgraded), Width x8 (downgraded)" in lspci(sim, "0000:63:00.0")


def test_healthy_box_passes_both_pcie_checks(tmp_path):
    _, ctx = make(tmp_path)
    rep = run_steps(ctx, steps(ctx, ("pcie-mrrs", "pcie-link")), "check")
    assert [s.status for s in rep.steps] == ["ok", "ok"]
    assert "8 function(s) at MaxReadReq 4096" in rep.steps[0].detail


def test_selection_excludes_audio_and_bridge(tmp_path):
    _, ctx = make(tmp_path, gpus=2)
    kinds = {f.bdf: f.kind for f in select_functions(ctx.host)}
    assert kinds == {"0000:17:00.0": "gpu", "0000:3d:00.0": "gpu"}
    with pytest.raises(GpuboxError, match="no PCI function 0000:99:00.0"):
        select_functions(ctx.host, ["0000:99:00.0"])


def test_decode_and_argv():
    d = decode_devctl(0x5134)  # the H200 of docs/facts.md: MRRS 4096, MPS 256
    assert (d["mrrs"], d["mps"], d["flr_bit"]) == (4096, 256, False)
    assert decode_devctl(0x2936)["mrrs"] == 512

    class H:
        sysfs_pci = "/sys/bus/pci"

    assert write_argv(H(), "0000:17:00.0", 5)[-1] == "CAP_EXP+8.w=5000:7000"
    assert write_argv(H(), "0000:17:00.0", 0)[-1] == "CAP_EXP+8.w=0000:7000"
