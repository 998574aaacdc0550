"""Ctrl-C and option names (issue 29, point 2).

A real SIGINT to a real `gpubox recover` at the container-restart prompt (on a pseudo-terminal,
as a person sees it): exit 130, a list of what was already changed, no "Fatal Python error".
`--profile` is the benchmark profile everywhere; the NCCL profile is `--nccl-profile`."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from gpubox.simbox import build
from tests.clirun import AT_A_TERMINAL, gpubox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_until(fd: int, proc: subprocess.Popen, want: bytes | None, limit: float) -> bytes:
    buf, end = b"", time.monotonic() + limit
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            buf += chunk
            if want is not None and want in buf:
                break
        elif proc.poll() is not None:
            break
    return buf


def _changes(sim) -> list[dict]:
    """Stand-in calls that change something (the check phase's reads, `pct status/config`, are not)."""
    reads = {("pct", "status"), ("pct", "config"), ("systemctl", "is-enabled"), ("systemctl", "is-active")}
    return [
        c
        for c in sim.calls()
        if (c["cmd"], (c.get("argv") or [""])[0]) not in reads and c["cmd"] != "journalctl"  # reads the log
    ]


def test_ctrl_c_at_the_plan_prompt_exits_130_with_nothing_changed(tmp_path):
    """Without --yes at a terminal, the whole plan is shown and asked about once, before any change
    (consent first): Ctrl-C there leaves the box exactly as it was."""
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major"], gpus=2)
    conf0 = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    master, slave = pty.openpty()
    env = dict(os.environ, GPUBOX_STATE_DIR=str(tmp_path / "state"), COLUMNS="200", PYTHONPATH=ROOT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            AT_A_TERMINAL,
            "-i",
            str(sim.inventory_path),
            "recover",
            "ct200",
            "--no-bench",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    try:
        out = _read_until(master, proc, b"[y/N]", 120)
        assert b"[y/N]" in out, out.decode(errors="replace")[-2000:]
        proc.send_signal(signal.SIGINT)
        out += _read_until(master, proc, None, 60)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert rc == 130, text[-2000:]
    assert "Fatal Python error" not in text and "Traceback" not in text
    assert "gpubox: interrupted" in text and "already changed" not in text
    head = text[: text.index("[y/N]")]
    assert (
        "will:" in head and "host-devices:" in head and "container-config:" in head
    )  # the plan, then one question
    assert sim.hpath("/etc/pve/lxc/200.conf").read_text() == conf0
    assert _changes(sim) == []  # stand-ins ran only to read


def test_the_plan_is_asked_once_and_a_yes_covers_the_restart(tmp_path):
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major"], gpus=2)
    master, slave = pty.openpty()
    env = dict(os.environ, GPUBOX_STATE_DIR=str(tmp_path / "state"), COLUMNS="200", PYTHONPATH=ROOT)
    argv = [
        sys.executable,
        "-c",
        AT_A_TERMINAL,
        "-i",
        str(sim.inventory_path),
        "recover",
        "ct200",
        "--no-bench",
    ]
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    try:
        out = _read_until(master, proc, b"[y/N]", 120)
        os.write(master, b"y\n")
        out += _read_until(master, proc, None, 120)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert rc == 0, text[-2000:]
    assert text.count("[y/N]") == 1, text[-2000:]  # one question for the whole plan
    assert any("reboot" in json.dumps(c) for c in sim.calls())  # the restart the yes covered ran


def test_without_a_terminal_a_restart_needs_yes_before_anything_changes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major", "numa_balancing"], gpus=2)
    conf0 = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "recover", "ct200", "--no-bench")
    assert rc == 2 and "--yes" in err and "nothing was changed" in err and len(err.strip().splitlines()) == 1
    assert sim.hpath("/etc/pve/lxc/200.conf").read_text() == conf0 and _changes(sim) == []


def test_profile_is_the_benchmark_profile_in_recover(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    sim = build(tmp_path / "box", ["nccl_missing"], gpus=2)
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "recover", "ct200", "--dry-run", "--profile", "health", "--json"
    )
    nccl = {s["name"]: s for s in json.loads(out)["steps"]}["nccl-env"]
    assert nccl["status"] == "drift" and "unknown NCCL profile" not in nccl["detail"]


def test_nccl_profile_has_its_own_name_and_the_old_spelling_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    sim = build(tmp_path / "box", ["nccl_missing"], gpus=2)
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "tune", "nccl", "ct200", "--profile", "pcie-2numa"
    )
    assert rc == 2 and "--nccl-profile pcie-2numa" in err and len(err.strip().splitlines()) == 1
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "tune", "nccl", "ct200", "--nccl-profile", "pcie-2numa", "--dry-run"
    )
    assert rc == 1 and "NCCL_PROTO=LL" in out
    rc, out, err = gpubox(capsys, "nccl", "export", "--profile", "pcie-2numa")
    assert rc == 2 and "--nccl-profile" in err


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_a_bad_benchmark_profile_is_refused_before_any_repair(tmp_path, capsys, monkeypatch, extra):
    """`recover --profile ful` did every repair, then failed at the benchmark with exit 1: the value
    is checked first (exit 2, one line), and the box is left exactly as it was."""
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    sim = build(tmp_path / "box", ["uvm_stale_major", "numa_balancing", "mrrs_512"], gpus=2)
    conf = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    numa = sim.hpath("/proc/sys/kernel/numa_balancing").read_text()
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--profile", "ful", *extra
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1, (rc, err)
    assert "'ful'" in err and "health" in err
    assert sim.hpath("/etc/pve/lxc/200.conf").read_text() == conf
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_text() == numa
    assert sim.calls() == []  # no stand-in (setpci, pct, nvidia-modprobe...) ran


def test_ctrl_c_says_how_to_go_on():
    """Ctrl-C anywhere (a staging copy too) ends 130 with the way on: re-run, a copy resumes.

    In a child process: the handler leaves with os._exit when other threads run, as they may in
    a test process, which would end pytest itself."""
    code = (
        "import gpubox.cli as c\n"
        "def boom(*a, **k):\n    raise KeyboardInterrupt\n"
        "c.cli.main = boom\n"
        "c.main(['stage', 'ct200'])\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert p.returncode == 130, p.stderr[-2000:]
    assert "interrupted" in p.stderr and "a copy resumes where it stopped" in p.stderr
    assert "Traceback" not in p.stderr
