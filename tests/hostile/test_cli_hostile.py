"""Exit codes and one-line causes for hostile command lines, bytes and file-system faults.

0 ok, 1 problems, 2 bad input / could not run, 130 interrupted (SIGINT); never a traceback, never
"internal error", at most one line on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from gpubox.simbox import build
from tests.clirun import AT_A_TERMINAL, gpubox


def _one_line(err: str) -> bool:
    """One error line (warnings may precede it), no traceback, no "internal error"."""
    lines = [ln for ln in err.splitlines() if ln and not ln.startswith("gpubox: warning:")]
    return len(lines) == 1 and "Traceback" not in err and "internal error" not in err


USAGE = [
    ("nosuchcommand",),
    ("tune", "pcie"),
    ("inventory", "show", "--bogus", "x"),
    ("tune", "pcie", "ct200", "--mrrs"),
    ("nccl", "export", "--format", "yaml"),
    ("-i",),
    ("bench", "--nope"),
    ("lxc", "fix"),
]


@pytest.mark.parametrize("argv", USAGE, ids=[" ".join(a) for a in USAGE])
def test_usage_errors_are_one_line_with_hint_exit_2(capsys, argv):
    rc, out, err = gpubox(capsys, *argv)
    assert rc == 2 and _one_line(err) and "--help" in err, err


def _sim(tmp_path):
    return build(tmp_path / "box", ("mrrs_512",), gpus=2)


def test_sigint_exits_130(tmp_path):
    """A real process interrupted while it works: 130, one line."""
    sim = _sim(tmp_path)
    stub = tmp_path / "bin"
    stub.mkdir()
    started = tmp_path / "setpci-started"
    slow = stub / "setpci"  # a setpci that hangs long enough to be interrupted, and says it began
    slow.write_text(f"#!/bin/sh\ntouch '{started}'\nsleep 30\n")
    slow.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen(
        [sys.executable, "-c", AT_A_TERMINAL, "-i", str(sim.inventory_path), "tune", "check", "ct200"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    # interrupted while it works (inside setpci), not while Python is still importing: wait for
    # the stub to start, however long a loaded machine takes (bounded by the stub's own 30 s)
    deadline = time.monotonic() + 120
    while not started.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), "gpubox never reached setpci"
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "Traceback" not in err


def test_non_utf8_sysfs_attribute(tmp_path, capsys):
    sim = _sim(tmp_path)
    sim.hpath("/sys/bus/pci/devices/0000:3d:00.0/vendor").write_bytes(b"0x10de\xff\n")
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "pcie", "ct200", "--dry-run")
    assert rc in (1, 2) and "internal error" not in err and "Traceback" not in err, out + err


def test_non_utf8_container_config(tmp_path, capsys):
    sim = _sim(tmp_path)
    conf = sim.hpath("/etc/pve/lxc/200.conf")
    conf.write_bytes(conf.read_bytes() + b"# caf\xe9\n")
    before = conf.read_bytes()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200")
    assert "internal error" not in err and "Traceback" not in err, out + err
    assert rc in (1, 2)
    assert conf.read_bytes() == before


def test_non_utf8_nccl_file_and_profile(tmp_path, capsys):
    f = tmp_path / "n.env"
    f.write_bytes(b"NCCL_DEBUG=WARN\xff\n")
    rc, out, err = gpubox(capsys, "nccl", "check", str(f))
    assert rc == 2 and _one_line(err) and "UTF-8" in err, err
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "bad.yaml").write_bytes(b'name: bad\nenv: {NCCL_DEBUG: "\xff"}\n')
    os.environ["GPUBOX_NCCL_PROFILES"] = str(d)
    try:
        rc, out, err = gpubox(capsys, "nccl", "show", "bad")
    finally:
        del os.environ["GPUBOX_NCCL_PROFILES"]
    assert rc == 2 and _one_line(err), err


def test_file_where_lock_directory_should_be(tmp_path, capsys, monkeypatch):
    """The box lock lives on the Proxmox host (gpubox.boxlock): a file where its directory should be."""
    sim = _sim(tmp_path)
    sim.hpath("/run/lock/gpubox").write_text("not a directory")
    before = sim.hpath("/etc/pve/lxc/200.conf").read_bytes()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "pcie", "ct200")
    assert rc == 2 and _one_line(err) and "/run/lock/gpubox" in err, err
    assert sim.hpath("/etc/pve/lxc/200.conf").read_bytes() == before


def test_export_into_missing_dir_and_onto_directory(tmp_path, capsys):
    for target in (tmp_path / "no" / "such" / "n.env", tmp_path):
        rc, out, err = gpubox(capsys, "nccl", "export", "--format", "envfile", "-o", str(target))
        assert rc == 2 and _one_line(err), err


@pytest.mark.parametrize("code", ["EROFS", "EPERM", "ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("where", ["open", "replace"])
def test_write_faults_are_one_line_and_leave_nothing_half_written(tmp_path, capsys, monkeypatch, code, where):
    """EROFS / EPERM (immutable file) / ENOSPC as the kernel raises them on open() or rename()
    (this machine cannot mount a read-only or full fs for a test): the boot unit gpubox would
    write is not left half-written and no temporary file stays behind."""
    import errno

    from gpubox.hwtune.pcie import UNIT_PATH

    sim = _sim(tmp_path)
    unit = sim.hpath(UNIT_PATH)
    real = getattr(os, where)
    n = getattr(errno, code)

    def failing(path, *a, **kw):
        if ".gpubox." in str(path) or str(path) == str(unit):
            raise OSError(n, os.strerror(n), str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(os, where, failing)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "pcie", "ct200", "--persist")
    monkeypatch.setattr(os, where, real)
    assert rc in (1, 2) and "internal error" not in err and "Traceback" not in err, out + err
    assert code in out + err or os.strerror(n) in out + err, out + err
    assert not unit.exists()
    assert not [p for p in unit.parent.iterdir() if ".gpubox." in p.name] if unit.parent.exists() else True


def test_known_hosts_revoked_and_non_utf8(tmp_path, sshd):
    from gpubox.errors import TransportError

    line = sshd.known_hosts.read_text().strip()
    host, key = line.split(" ", 1)
    kh = tmp_path / "kh"
    kh.write_text(f"@revoked * {key}\n{line}\n")
    t = sshd.transport(known_hosts=str(kh))
    with pytest.raises(TransportError, match="revoked"):
        t.run(["true"])
    kh.write_text(f"@cert-authority *.example ssh-ed25519 AAAA\n{line}\n# comment\ngarbage line here\n")
    assert sshd.transport(known_hosts=str(kh)).run(["true"]).rc == 0
    kh.write_bytes(b"\xff\xfe bad\n" + line.encode() + b"\n")
    with pytest.raises(TransportError, match="not UTF-8"):
        sshd.transport(known_hosts=str(kh)).run(["true"])
