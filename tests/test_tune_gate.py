"""`gpubox tune` has no input checks of its own (issue 25): a bad tuning (or bench) value is refused by the
steps' options through the engine's one gate, with the same one-line error and exit 2 as
`gpubox doctor` / `gpubox recover`, before anything is read or written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpubox.simbox import build
from tests.clirun import gpubox

CLI = Path(__file__).resolve().parents[1] / "hwtune" / "commands" / "tune.py"

BAD = [
    ("gpubox_pcie_mrrs", 3000, ["tune", "pcie"], "invalid MaxReadReq '3000'"),
    # the inventory's schema (gpubox.invschema) refuses these when the box is loaded
    ("gpubox_numa_balancing", 5, ["tune", "numa"], "pve1: gpubox_numa_balancing = 5 is outside 0..2"),
    (
        "gpubox_numa_balancing",
        "off",
        ["tune", "check"],
        "gpubox_numa_balancing = 'off' is not a whole number",
    ),
]


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))


def test_the_tune_cli_checks_nothing_itself():
    src = CLI.read_text()
    assert not re.search(r"\b(parse_mrrs|select_functions|desired)\(", src)


@pytest.mark.parametrize("var,value,cmd,msg", BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_tune_and_recover_refuse_a_bad_value_alike(tmp_path, capsys, var, value, cmd, msg):
    sim = build(tmp_path / "box", ["mrrs_512", "numa_balancing"], gpus=2)
    sim.inventory_extra["host"][var] = value
    sim.write_inventory()
    calls = len(sim.calls())
    knob = sim.hpath("/proc/sys/kernel/numa_balancing").read_text()
    errs = []
    for argv in (cmd + ["ct200"], ["recover", "ct200", "--yes", "--no-bench"], ["doctor", "ct200"]):
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, *argv)
        assert rc == 2 and err.count("\n") == 1 and msg in err, (argv, out, err)
        errs.append(err)
    assert len(set(errs)) == 1  # one gate: the very same line from every command
    assert len(sim.calls()) == calls and sim.hpath("/proc/sys/kernel/numa_balancing").read_text() == knob


def test_an_include_the_host_lacks_is_bad_input_before_any_write(tmp_path, capsys):
    sim = build(tmp_path / "box", ["mrrs_512"], gpus=2)
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "tune", "pcie", "ct200", "--include", "0000:99:00.0", "--json"
    )
    assert rc == 2 and err.count("\n") == 1 and "--include 99:00.0" not in err
    assert "no PCI function 0000:99:00.0" in err and not [c for c in sim.calls() if c["cmd"] == "setpci"]


@pytest.mark.parametrize("value", ["a day", -1, 0, True, float("nan")])
def test_a_bad_bench_age_is_bad_input_before_anything_runs(tmp_path, capsys, value):
    """gpubox_bench.max_age_s is the bench step's option: exit 2 from doctor, not an internal error."""
    sim = build(tmp_path / "box", gpus=2)
    sim.inventory_extra["container"].setdefault("gpubox_bench", {})["max_age_s"] = value
    sim.write_inventory()
    calls = len(sim.calls())
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200")
    assert rc == 2 and err.count("\n") == 1 and "gpubox_bench.max_age_s" in err, out + err
    assert len(sim.calls()) == calls


def test_lxc_recover_and_doctor_refuse_a_bad_device_mode_alike(tmp_path, capsys):
    """`gpubox lxc` has no check of its own either: gpubox_device_mode is container-config's option."""
    sim = build(tmp_path / "box", ["uvm_stale_major"], gpus=2)
    sim.inventory_extra["container"]["gpubox_device_mode"] = "cdi"
    sim.write_inventory()
    conf = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    calls = len(sim.calls())
    errs = set()
    for argv in (
        ["lxc", "fix", "ct200", "--yes"],
        ["recover", "ct200", "--yes", "--no-bench"],
        ["doctor", "ct200"],
    ):
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, *argv)
        assert rc == 2 and err.count("\n") == 1 and "ct200: gpubox_device_mode 'cdi' is not known" in err, err
        errs.add(err)
    assert len(errs) == 1 and len(sim.calls()) == calls
    assert sim.hpath("/etc/pve/lxc/200.conf").read_text() == conf
