"""The one lock per box lives on the Proxmox host: two control nodes (different state directories),
the timer's run-once and an operator's recover, a local and an SSH transport all meet on it; a
killed holder leaves no lock and its stale record is recognised; the holder's record cannot reach
the terminal raw."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpubox.context import Context
from gpubox.inventory import Inventory
from gpubox.simbox import build

ROOT = Path(__file__).resolve().parents[2]
HOLD = (
    "import sys; from gpubox.context import Context; from gpubox.inventory import Inventory\n"
    "from gpubox.boxlock import box_lock\n"
    "inv = Inventory(sys.argv[1]); ctx = Context(box=inv.box('ct200'), inventory=inv)\n"
    "with box_lock(ctx, sys.argv[2]):\n"
    "    print('held', flush=True); sys.stdin.read()\n"
)


def _env(state: Path, wait: str = "0.3") -> dict[str, str]:
    return {**os.environ, "GPUBOX_STATE_DIR": str(state), "GPUBOX_LOCK_WAIT": wait, "PYTHONPATH": str(ROOT)}


def _holder(inv: Path, state: Path, what: str = "gpubox recover ct200") -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(inv), what],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(state),
    )
    line = p.stdout.readline().strip()
    assert line == "held", p.stderr.read()
    return p


def _gpubox(inv: Path, state: Path, *args: str, wait: str = "0.3") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpubox.cli", "-i", str(inv), *args],
        capture_output=True,
        text=True,
        env=_env(state, wait),
        timeout=300,
    )


def _digest(d: Path) -> dict[str, str]:
    skip = ("calls.jsonl", ".sim.lock")
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name not in skip and "run/lock/gpubox" not in str(p)
    }


@pytest.fixture
def faulty(tmp_path):
    return build(tmp_path / "box", ("numa_balancing", "uvm_stale_major"))


@pytest.mark.parametrize(
    "second",
    [
        ("recover", "ct200", "--no-bench"),
        ("tune", "numa", "ct200"),
        ("lxc", "fix", "ct200"),
        ("bench", "ct200"),
    ],
    ids=["recover", "tune-numa", "lxc-fix", "bench"],
)
def test_two_state_dirs_exclude_each_other(tmp_path, faulty, second):
    """The timer's state dir (/var/lib/gpubox) and the operator's default one: before, each had its
    own lock file and both changed the box at once."""
    holder = _holder(faulty.inventory_path, tmp_path / "timer-state", "gpubox schedule run-once ct200")
    try:
        before = _digest(faulty.dest)
        p = _gpubox(faulty.inventory_path, tmp_path / "operator-state", *second)
        after = _digest(faulty.dest)
    finally:
        holder.communicate("", timeout=30)
    assert before == after, "DAMAGE: the box changed while another run held its lock"
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"`gpubox schedule run-once ct200` is already running (pid {holder.pid}" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def _ssh_inventory(sim, sshd, path: Path) -> Path:
    """The same simulated box, its Proxmox host reached over real SSH instead of locally."""
    inv = yaml.safe_load(sim.inventory_path.read_text())
    hosts = inv["all"]["children"]["proxmox_hosts"]["hosts"]
    (name,) = hosts
    hv = hosts[name]
    hv.pop("ansible_connection", None)
    hv.update(sshd.vars())
    path.write_text(yaml.safe_dump(inv))
    return path


def test_ssh_and_local_front_ends_meet_on_one_lock(tmp_path, faulty, sshd):
    ssh_inv = _ssh_inventory(faulty, sshd, tmp_path / "ssh-inventory.yml")
    holder = _holder(ssh_inv, tmp_path / "node-a", "gpubox tune pcie ct200")
    try:
        before = _digest(faulty.dest)
        p = _gpubox(faulty.inventory_path, tmp_path / "node-b", "tune", "numa", "ct200")
        after = _digest(faulty.dest)
    finally:
        holder.communicate("", timeout=30)
    assert p.returncode == 2 and "`gpubox tune pcie ct200` is already running" in p.stderr, p.stderr
    assert before == after, "DAMAGE: two control nodes changed the box at once"
    # and the other way round, once the SSH holder has let go
    holder = _holder(faulty.inventory_path, tmp_path / "node-b", "gpubox recover ct200")
    try:
        q = _gpubox(ssh_inv, tmp_path / "node-a", "tune", "numa", "ct200")
    finally:
        holder.communicate("", timeout=30)
    assert q.returncode == 2 and "`gpubox recover ct200` is already running" in q.stderr, q.stderr


@pytest.mark.parametrize("over", ["local", "ssh"])
def test_killed_holder_leaves_no_lock_and_a_recognised_stale_record(tmp_path, faulty, sshd, over):
    inv = faulty.inventory_path if over == "local" else _ssh_inventory(faulty, sshd, tmp_path / "ssh.yml")
    holder = _holder(inv, tmp_path / "a", "gpubox recover ct200")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    from gpubox.boxlock import box_lock

    os.environ["GPUBOX_LOCK_WAIT"] = "30"  # the host-side flock ends once it reads EOF: not instant
    try:
        i = Inventory(inv)
        ctx = Context(box=i.box("ct200"), inventory=i)
        with box_lock(ctx, "test") as info:
            assert info.stale and info.stale["pid"] == holder.pid, info
        ctx.close()
    finally:
        os.environ.pop("GPUBOX_LOCK_WAIT", None)
    # the record of the dead holder is gone with our release: nothing is left that claims the box
    assert not faulty.hpath("/run/lock/gpubox/ct200.holder").exists()


def test_holder_record_cannot_reach_the_terminal_raw(tmp_path, faulty):
    evil = "gpubox \x1b]0;pwned\x07\x1b[2J\u202erecover\x9b31m"
    holder = _holder(faulty.inventory_path, tmp_path / "a", evil)
    try:
        p = _gpubox(faulty.inventory_path, tmp_path / "b", "tune", "numa", "ct200")
    finally:
        holder.communicate("", timeout=30)
    assert p.returncode == 2
    assert not any(c in p.stderr for c in "\x1b\x07\u202e\x9b"), repr(p.stderr)
    assert "\\x1b]0;pwned" in p.stderr


def test_forged_record_of_a_dead_process_is_not_trusted(tmp_path, faulty):
    """A holder file left by a process that died (or forged): a later refusal must not name it."""
    holder = _holder(faulty.inventory_path, tmp_path / "a", "gpubox recover ct200")
    try:
        rec = faulty.hpath("/run/lock/gpubox/ct200.holder")
        rec.write_text('{"what": "innocent bystander", "pid": 1, "node": "x", "host_pid": 999999999}')
        p = _gpubox(faulty.inventory_path, tmp_path / "b", "tune", "numa", "ct200")
    finally:
        holder.communicate("", timeout=30)
    assert p.returncode == 2 and "innocent bystander" not in p.stderr
    assert "another process holds it" in p.stderr, p.stderr


def test_release_then_free(tmp_path, faulty):
    holder = _holder(faulty.inventory_path, tmp_path / "a")
    holder.communicate("", timeout=30)
    p = _gpubox(faulty.inventory_path, tmp_path / "b", "tune", "numa", "ct200", wait="20")
    assert p.returncode in (0, 1), p.stderr


def test_a_timer_run_and_recover_started_together_never_both_change_the_box(tmp_path, faulty):
    """The real `schedule run-once` (held in its alert hook) and a real `recover` with another
    state directory: recover is refused naming the timer's run, and the box is unchanged."""
    import json as _json

    started = tmp_path / "started"
    hook = tmp_path / "slow-hook"
    hook.write_text(
        f"#!{sys.executable}\nimport pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(8)\n"
    )
    hook.chmod(0o755)
    inv = yaml.safe_load(faulty.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_alert_command"] = [str(hook)]
    faulty.inventory_path.write_text(yaml.safe_dump(inv))
    fix = ROOT / "tests" / "fixtures" / "history" / "run07.json"
    timer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpubox.cli",
            "-i",
            str(faulty.inventory_path),
            "schedule",
            "run-once",
            "ct200",
        ]
        + ["--no-doctor", "--json", "--from-json", str(fix)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path / "var-lib-gpubox"),
    )
    try:
        while not started.exists():
            assert timer.poll() is None, timer.communicate()
            time.sleep(0.05)
        before = _digest(faulty.dest)
        p = _gpubox(faulty.inventory_path, tmp_path / "operator", "recover", "ct200", "--no-bench")
        after = _digest(faulty.dest)
        out, err = timer.communicate(timeout=120)
    finally:
        if timer.poll() is None:
            timer.kill()
    assert before == after, "DAMAGE: recover changed the box during the timer's run"
    assert p.returncode == 2 and "`gpubox schedule run-once ct200` is already running" in p.stderr, p.stderr
    assert _json.loads(out)["run_id"], err
