"""A typo gets a hint that points at what was meant, from every place a name is typed."""

from __future__ import annotations

import json

import pytest

from gpubox.suggest import close, hint
from tests.clirun import gpubox


@pytest.mark.parametrize(
    "word,choices,want",
    [
        ("ct2", ["ct200", "ct201", "web"], ["ct200", "ct201"]),  # a prefix ranks first
        ("docter", ["doctor", "demo", "recover"], ["doctor"]),
        ("uvm_stale", ["uvm_stale_major", "uvm_missing", "mrrs_512"], ["uvm_stale_major"]),
        ("zzz", ["doctor", "demo"], []),
        ("NCCL_proto", ["NCCL_PROTO", "NCCL_SOCKET_IFNAME"], ["NCCL_PROTO"]),  # any case; own spelling back
    ],
)
def test_close(word, choices, want):
    assert close(word, choices) == want
    assert (hint(word, choices) == "") == (want == [])


def test_an_option_prefix_suggests_only_what_it_starts(capsys):
    rc, out, err = gpubox(capsys, "recover", "ct200", "--dry")
    assert rc == 2 and "'--dry-run'" in err and "--yes" not in err


def test_box_and_fault_typos_get_a_hint(tmp_path, capsys):
    rc, out, err = gpubox(capsys, "demo", "--fault", "uvm_stale", "--keep", str(tmp_path / "d"))
    assert rc == 2 and "Did you mean 'uvm_stale_major'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()
    from gpubox.simbox import build

    sim = build(tmp_path / "box", [])
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct20")
    assert rc == 2 and "Did you mean 'ct200'" in err


def test_contradictory_faults_are_refused(tmp_path, capsys):
    rc, out, err = gpubox(
        capsys,
        "sim",
        "create",
        str(tmp_path / "b"),
        "--fault",
        "numa_balancing",
        "--fault",
        "no_numa_balancing",
    )
    assert rc == 2 and "contradict" in err and len(err.strip().splitlines()) == 1


def test_json_errors_are_json_on_stdout(capsys):
    """With --json a machine reads stdout: an exit-2 error is an object there too, not nothing."""
    rc, out, err = gpubox(capsys, "-i", "/nonexistent/inv.yml", "doctor", "ct200", "--json")
    assert rc == 2 and err.strip()
    doc = json.loads(out)
    assert doc["exit_code"] == 2 and doc["error"] == err.strip()
