"""A newcomer's first hour, second pass: a typo gets a hint that points at what was meant, each practice
box is its own box, and a problem software cannot fix still gets a measured verdict."""

from __future__ import annotations

import json
import os
import shlex

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


def test_each_simulated_box_keeps_its_own_state(tmp_path, capsys, monkeypatch):
    """Two practice boxes, no $GPUBOX_STATE_DIR: each run's records land in its own box's state dir
    (gpubox_control_state_dir in the box's inventory), none in the user's default one."""
    from gpubox.simbox import build

    monkeypatch.delenv("GPUBOX_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    a = build(tmp_path / "a", ["numa_balancing"])
    b = build(tmp_path / "b", [])
    for sim in (a, b):
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--no-bench")
        assert rc == 0, err
        monkeypatch.delenv("GPUBOX_STATE_DIR", raising=False)  # as a new process starts
    runs = {s: sorted(p.name for p in (s.dest / "state").rglob("*") if p.is_file()) for s in (a, b)}
    assert runs[a] and runs[b], runs
    assert not (tmp_path / "xdg" / "gpubox").exists() or not any(
        (tmp_path / "xdg" / "gpubox").rglob("*.json")
    )


def test_sim_rm_removes_a_simulated_box_and_nothing_else(tmp_path, capsys):
    from gpubox.simbox import build

    sim = build(tmp_path / "box", [])
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    rc, out, err = gpubox(capsys, "sim", "rm", str(other))
    assert rc == 2 and "not a simulated box" in err and (other / "keep.txt").read_text() == "mine"
    rc, out, err = gpubox(capsys, "sim", "rm", str(sim.dest))
    assert rc == 0 and not sim.dest.exists()


def test_demo_without_keep_leaves_no_directory(tmp_path, capsys, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rc, out, err = gpubox(capsys, "demo", "--fault", "numa_balancing", "--no-bench", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["kept"] is False and not os.path.exists(doc["demo_dir"])
    assert [p for p in tmp_path.iterdir() if p.name.startswith("gpubox-demo-")] == []


@pytest.mark.parametrize("fault,step", [("link_degraded", "pcie-link"), ("lockdown", "pcie-mrrs")])
def test_a_problem_software_cannot_fix_still_gets_a_measured_verdict(tmp_path, capsys, fault, step):
    """A PCIe link trained low or kernel lockdown cannot be repaired by gpubox; the box can still be
    measured: recover benchmarks it and the verdict is degraded, naming what is left (exit 1)."""
    from gpubox.simbox import build

    sim = build(tmp_path / "box", [fault, "mrrs_512", "numa_balancing"], gpus=2)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--json")
    doc = json.loads(out)
    assert rc == 1, err
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps[step]["status"] in ("failed", "drift")
    assert steps["numa-balancing"]["status"] == "fixed"
    assert "bench" in steps, doc.get("notes")
    verdict = doc["benchmark"]["verdict"]
    assert verdict["status"] == "degraded"
    assert any(r["key"] == "box" and step in r["message"] for r in verdict["reasons"])


def test_repair_hints_repeat_the_inventory_the_user_gave(tmp_path, capsys):
    """Every `gpubox ...` a repair hint tells the user to type carries the `-i PATH` they gave."""
    from gpubox.simbox import build

    sim = build(tmp_path / "box", ["seed"])
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200", "--json")
    hints = [s["repair"] for s in json.loads(out)["steps"] if s.get("repair") and "gpubox " in s["repair"]]
    assert rc == 1 and hints
    want = f"gpubox -i {shlex.quote(str(sim.inventory_path))} "
    assert all(want in h for h in hints), hints


def test_ctrl_c_in_the_benchmark_says_what_the_repairs_changed(tmp_path, monkeypatch):
    from gpubox.bench import runner
    from gpubox.context import Context
    from gpubox.errors import Interrupted
    from gpubox.inventory import Inventory
    from gpubox.provision.recover import recover
    from gpubox.simbox import build

    sim = build(tmp_path / "box", ["numa_balancing"], gpus=2)

    def ctrl_c(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_box", ctrl_c)
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv, options={"yes": True, "persist": True})
    with pytest.raises(Interrupted) as ei:
        recover(ctx, out_dir=str(tmp_path / "out"))
    lines = ei.value.summary()
    assert any(l.startswith("already changed: numa-balancing") for l in lines), lines
    assert lines[-1] == "interrupted while running: bench (the verification benchmark)"


@pytest.mark.parametrize(
    "log,want",
    [
        (
            "# gpubox: python -m vllm ...\nINFO loading\nERROR RuntimeError: CUDA error: unknown error\n"
            "ERROR Engine core initialization failed. See root cause above.\n",
            "RuntimeError: CUDA error: unknown error",
        ),
        ("INFO a\nValueError: max_model_len 40000 > 32768\n", "ValueError: max_model_len 40000 > 32768"),
        ("INFO all fine\nINFO still fine\n", None),
    ],
)
def test_the_server_log_cause_line(log, want):
    from gpubox.bench.launcher import cause_line

    assert cause_line(log) == want


def test_a_server_that_fails_to_start_is_failed_with_its_cause(tmp_path, capsys):
    from gpubox.simbox import build

    sim = build(tmp_path / "box", ["server_fail"], gpus=2)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--json")
    doc = json.loads(out)
    bench = {s["name"]: s for s in doc["steps"]}["bench"]
    assert rc == 1 and bench["status"] == "failed", bench
    reasons = " ".join(r["message"] for r in doc["benchmark"]["verdict"]["reasons"])
    assert "CUDA error: unknown error" in reasons
