"""The fault matrix of `gpubox doctor` / `gpubox recover` on the simulated box (issue 8).

For each fault alone, and all of them together: doctor exits 1 and names the cause, `recover
--yes` repairs it, doctor then exits 0, and a second recover changes nothing. Once over real SSH
to a local sshd too. The benchmark runs only where it is the point (all faults, server_fail):
it takes the simulated server several seconds a run.
"""

from __future__ import annotations

import json

import pytest
import yaml

from gpubox.simbox import build
from tests.bench_helpers import fell_behind
from tests.clirun import gpubox

# fault -> the step(s) doctor must flag
MATRIX = {
    "uvm_stale_major": {"container-config"},
    "uvm_missing": {"host-devices"},
    "container_stopped": {"container"},
    "conf_devn_collision": {"container-config"},
    "mrrs_512": {"pcie-mrrs"},
    "numa_balancing": {"numa-balancing"},
    "nccl_missing": {"nccl-env"},
    "nccl_misspelled": {"nccl-env"},
    "shm_empty": {"model-stage", "drafter-stage"},
    "truncated_shard": {"model-stage"},
}
PROBLEM = ("drift", "failed")


def _doctor(capsys, inv):
    rc, out, err = gpubox(capsys, "-i", inv, "doctor", "ct200", "--json")
    return rc, json.loads(out)


def _recover(capsys, inv, *extra):
    rc, out, err = gpubox(capsys, "-i", inv, "recover", "ct200", "--yes", "--json", *extra)
    return rc, json.loads(out)


def _problems(doc):
    return {s["name"] for s in doc["steps"] if s["status"] in PROBLEM}


def _run_matrix(capsys, inv, expect_steps):
    rc, before = _doctor(capsys, inv)
    assert rc == 1, before
    found = _problems(before)
    assert expect_steps <= found, f"doctor flagged {found}, expected {expect_steps}"
    for s in before["steps"]:
        if s["name"] in expect_steps:
            assert s["cause"] and s["repair"], s  # each problem says why and what to do

    rc, rec = _recover(capsys, inv, "--no-bench")
    assert rc == 0, [(s["name"], s["status"], s["detail"]) for s in rec["steps"]]
    fixed = {s["name"] for s in rec["steps"] if s["status"] == "fixed"}
    assert expect_steps <= fixed and all(s["changed"] for s in rec["steps"] if s["status"] == "fixed")

    rc, after = _doctor(capsys, inv)
    assert rc == 0, _problems(after)

    rc, again = _recover(capsys, inv, "--no-bench")
    assert rc == 0 and again["changed"] is False
    assert not [s["name"] for s in again["steps"] if s["changed"]]


@pytest.mark.parametrize("fault", sorted(MATRIX))
def test_fault_alone(fault, tmp_path, capsys):
    sim = build(tmp_path / "box", [fault])
    _run_matrix(capsys, str(sim.inventory_path), MATRIX[fault])


def test_healthy_box_doctor_ok_and_recover_noop(tmp_path, capsys):
    sim = build(tmp_path / "box", [])
    rc, doc = _doctor(capsys, str(sim.inventory_path))
    assert rc == 0, _problems(doc)
    rc, rec = _recover(capsys, str(sim.inventory_path), "--no-bench")
    assert rc == 0 and not rec["changed"]
    assert sim.calls("pct") == [] or all(
        c["argv"][0] in ("status", "config", "exec") for c in sim.calls("pct")
    )


def test_snapshot_and_pending_sections_survive_the_fix(tmp_path, capsys):
    sim = build(tmp_path / "box", ["uvm_stale_major", "conf_pending"])
    conf = sim.hpath("/etc/pve/lxc/200.conf")
    before = conf.read_text()
    tail_before = before[before.index("\n[") :]  # everything from the first section header
    _run_matrix(capsys, str(sim.inventory_path), {"container-config"})
    after = conf.read_text()
    assert after[after.index("\n[") :] == tail_before
    assert "c 511:* rwm" in after.split("\n[")[0] and "c 511:* rwm" not in tail_before


def test_all_faults_together_with_benchmark(tmp_path, capsys):
    faults = sorted(
        set(MATRIX) - {"nccl_misspelled", "truncated_shard"}
    )  # these overlap nccl_missing / shm_empty
    sim = build(tmp_path / "box", faults)
    inv = str(sim.inventory_path)
    rc, before = _doctor(capsys, inv)
    assert rc == 1
    want = set().union(*(MATRIX[f] for f in faults))
    assert want <= _problems(before)
    rc, rec = _recover(capsys, inv, "--out", str(tmp_path / "results"))
    assert rc == 0 or fell_behind(sim), [(s["name"], s["status"], s["detail"]) for s in rec["steps"]]
    assert rec["benchmark"]["verdict"]["status"] == "healthy" or fell_behind(sim)
    assert rec["benchmark"]["report"] and (tmp_path / "results").exists()
    rc, after = _doctor(capsys, inv)
    assert rc == 0
    rc, again = _recover(capsys, inv, "--no-bench")
    assert rc == 0 and not again["changed"]


def test_server_that_fails_to_start_is_reported(tmp_path, capsys):
    sim = build(tmp_path / "box", ["server_fail"])
    rc, rec = _recover(capsys, str(sim.inventory_path), "--out", str(tmp_path / "results"))
    assert rc == 1
    assert rec["benchmark"]["verdict"]["status"] == "failed"
    result = json.loads(open(rec["benchmark"]["result"]).read())
    failed = [s for s in result["servers"] if s["status"] == "failed"]
    assert failed and failed[0]["log_tail"], "the server's log tail must be in the result"
    rc, doc = _doctor(capsys, str(sim.inventory_path))
    assert rc == 1 and "bench" in _problems(doc)


def test_dry_run_changes_nothing_and_shows_every_change(tmp_path, capsys):
    sim = build(tmp_path / "box", ["uvm_stale_major", "mrrs_512", "numa_balancing", "shm_empty"])

    def snapshot():
        out = {}
        for p in sorted(sim.dest.rglob("*")):
            if p.is_file() and "state" not in p.parts and p.name not in ("calls.jsonl", ".sim.lock"):
                out[str(p)] = p.read_bytes()
        return out

    before = snapshot()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--dry-run", "--json")
    doc = json.loads(out)
    assert rc == 1
    assert snapshot() == before
    steps = {s["name"]: s for s in doc["steps"]}
    assert "+lxc.cgroup2.devices.allow: c 511:* rwm" in steps["container-config"]["diff"]
    assert any("CAP_EXP+8.w=5000:7000" in a for argv in steps["pcie-mrrs"]["commands"] for a in argv)
    assert steps["numa-balancing"]["diff"] or steps["numa-balancing"]["commands"]


def test_skip_and_only_select_steps(tmp_path, capsys):
    sim = build(tmp_path / "box", ["numa_balancing", "mrrs_512"])
    rc, rec = _recover(capsys, str(sim.inventory_path), "--no-bench", "--only", "numa-balancing")
    assert [s["name"] for s in rec["steps"]] == ["numa-balancing"] and rc == 0
    rc, doc = _doctor(capsys, str(sim.inventory_path))
    assert _problems(doc) == {"pcie-mrrs"}
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--only", "nosuchstep")
    assert rc == 2 and "unknown step" in err and len(err.strip().splitlines()) == 1


def test_matrix_over_ssh(sshd, tmp_path, capsys):
    """The same fault run with both hosts reached over real SSH (host keys pinned)."""
    sim = build(
        tmp_path / "box",
        ["uvm_stale_major", "uvm_missing", "mrrs_512", "numa_balancing", "nccl_missing", "shm_empty"],
    )
    inv = yaml.safe_load(sim.inventory_path.read_text())
    for group in ("proxmox_hosts", "gpu_containers"):
        for name, hv in inv["all"]["children"][group]["hosts"].items():
            hv.pop("ansible_connection")
            hv.update(sshd.vars())
    path = tmp_path / "ssh-inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    want = {"container-config", "host-devices", "pcie-mrrs", "numa-balancing", "nccl-env", "model-stage"}
    _run_matrix(capsys, str(path), want)


def test_a_benchmark_setting_that_cannot_run_is_refused_before_any_repair(tmp_path, capsys):
    """A bad benchmark setting (TP 16 on an 8-GPU box) is bad input: exit 2 with one line before
    anything changes, not every repair first and a failed bench row at the end."""
    sim = build(tmp_path / "box", ["numa_balancing"])
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"]["tp"] = [16]
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    before = sim.hpath("/proc/sys/kernel/numa_balancing").read_text()
    rc, out, err = gpubox(capsys, "-i", str(sim.inventory_path), "recover", "ct200", "--yes")
    assert rc == 2 and "TP 16" in err and len(err.strip().splitlines()) == 1, err
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_text() == before
