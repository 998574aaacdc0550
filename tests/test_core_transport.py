"""Transports: local subprocess, SSH against a real sshd, `pct exec` through a fake `pct`.

One protocol (argv run, atomic write, read, stat, listdir) checked on all three, plus the SSH
host-key policy and the one-line errors for a missing key, a refused port and a silent host.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import paramiko
import pytest

from gpubox.errors import CommandError, InventoryError, TransportError
from gpubox.host import Host, connect, connect_box, transport_for
from gpubox.inventory import Box, HostEntry, Inventory
from gpubox.transport.local import LocalTransport
from gpubox.transport.pct import PctTransport
from gpubox.transport.ssh import SSHTransport

# Arguments a shell would mangle: they must arrive byte for byte as separate argv elements.
NASTY = [
    "a b",
    "$(id -u)",
    "`id`",
    "; rm -rf /tmp/nothing",
    "'single'",
    '"double"',
    "back\\slash",
    "*",
    "~",
    "",
    "new\nline",
    "tab\there",
    "ümlaut €",
    "--",
    "-n",
    "$HOME",
    "a|b&c>d<e",
]


def _echo_args(t, extra_env=None):
    """Run a Python that prints its argv as JSON: proves each element arrived intact."""
    import json

    r = t.run(
        [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))", *NASTY], env=extra_env
    )
    assert r.rc == 0, r.stderr
    return json.loads(r.stdout)


def _mknod_chr(path: Path, major: int, minor: int) -> None:
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("mknod is not permitted here")


def _protocol(t, d: Path):
    """The file half of the Transport interface, on a real directory `d` reachable through `t`."""
    f = d / "sub" / "file.conf"
    t.makedirs(str(f.parent))
    assert t.stat(str(f.parent)).is_dir
    assert t.stat(str(f)) is None
    with pytest.raises(FileNotFoundError):
        t.read_bytes(str(f))
    blob = bytes(range(256)) * 4  # every byte value: no text decoding on the way
    t.write_bytes_atomic(str(f), blob, mode=0o640)
    assert f.read_bytes() == blob
    assert t.read_bytes(str(f)) == blob
    st = t.stat(str(f))
    assert st.is_file and st.size == len(blob) and st.perms == 0o640 and st.rdev is None
    # Overwrite: a reader holding the old file keeps seeing the old bytes (rename, not rewrite),
    # the mode is kept, and no temporary is left behind.
    with open(f, "rb") as old_reader:
        t.write_bytes_atomic(str(f), b"new\n")
        assert old_reader.read() == blob
    assert f.read_bytes() == b"new\n"
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    assert sorted(os.listdir(f.parent)) == ["file.conf"]
    assert t.listdir(str(f.parent)) == ["file.conf"]
    # Proxmox-style temporary name (<file>.tmp.<pid>) is honoured and renamed away.
    t.write_bytes_atomic(str(f), b"third\n", tmp_name="file.conf.tmp.4242")
    assert f.read_bytes() == b"third\n" and sorted(os.listdir(f.parent)) == ["file.conf"]
    dev = d / "nvidia-uvm"
    _mknod_chr(dev, 511, 0)
    s = t.stat(str(dev))
    assert s.is_char_device and s.rdev == (511, 0)
    zero = d / "zero-zero"
    _mknod_chr(zero, 0, 0)
    assert t.stat(str(zero)).rdev == (0, 0)
    t.remove(str(f))
    assert not f.exists()


# ---------------------------------------------------------------------------------- local
def test_local_argv_arrives_intact_and_no_shell():
    t = LocalTransport("here")
    assert _echo_args(t) == NASTY
    with pytest.raises(TypeError):
        t.run("echo hi; id")


def test_local_stdin_rc_env_cwd(tmp_path):
    t = LocalTransport("here")
    assert t.run(["cat"], input="to stdin\n").stdout == "to stdin\n"
    r = t.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (r.rc, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    with pytest.raises(CommandError, match="exited 3 on here: err"):
        r.check()
    assert t.run(["no-such-command-gpubox"]).rc == 127
    assert t.run(["sh", "-c", 'printf %s "$GPUBOX_X"'], env={"GPUBOX_X": "a b;$c"}).stdout == "a b;$c"
    assert t.run(["pwd"], cwd=str(tmp_path)).stdout.strip() == str(tmp_path)


def test_local_timeout_is_one_line_error_naming_host(tmp_path):
    t = LocalTransport("slowbox")
    pidfile = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    with pytest.raises(TransportError) as ei:
        t.run(["sh", "-c", f"sleep 30 & echo $! > {pidfile}; wait"], timeout=0.5)
    assert time.monotonic() - t0 < 30  # not the command's own 30 s: the timeout ended it (no tighter bound)
    assert "timed out after 0.5 s on slowbox" in str(ei.value) and "\n" not in str(ei.value)
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 3  # the grandchild went with its process group
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


# A command that says one line on stderr, then nothing while it runs on (a hung remote python), and
# one that talks on stderr all the time (a copier's progress) but runs longer than the idle limit.
SILENT = ["sh", "-c", "echo started >&2; sleep 30"]
# 3 s of work with a line every 0.1 s against a 2 s idle limit: it outlives the limit (so a limit that
# ignored the lines would end it) with gaps 20x shorter than the limit.
CHATTY = ["sh", "-c", "i=0; while [ $i -lt 30 ]; do echo tick >&2; sleep 0.1; i=$((i+1)); done; echo done"]


def test_local_idle_limit_ends_a_command_that_falls_silent():
    t = LocalTransport("box")
    seen = []
    t0 = time.monotonic()
    with pytest.raises(TransportError) as ei:
        t.run(SILENT, timeout=120, idle=1, on_stderr=seen.append)
    assert time.monotonic() - t0 < 30 and seen == ["started"]
    assert "said nothing for 1 s on box" in str(ei.value) and "\n" not in str(ei.value)


def test_local_idle_limit_spares_a_command_that_keeps_talking():
    r = LocalTransport("box").run(CHATTY, timeout=120, idle=2, on_stderr=lambda _line: None)
    assert r.rc == 0 and r.stdout == "done\n" and r.stderr.count("tick") == 30


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_local_file_protocol(tmp_path):
    _protocol(LocalTransport(), tmp_path)


def test_local_failed_write_leaves_old_file_and_no_temporary(tmp_path):
    t = LocalTransport()
    target = tmp_path / "conf"
    target.mkdir()  # renaming a file over a directory fails after the temporary was written
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        t.write_bytes_atomic(str(target), b"data")
    assert (target / "keep").read_text() == "x"
    assert sorted(os.listdir(tmp_path)) == ["conf"]


# ---------------------------------------------------------------------------------- ssh
@pytest.fixture
def ssh(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts of the user's
    t = sshd.transport("pve1")
    yield t
    t.close()


def test_ssh_argv_arrives_intact(ssh):
    assert _echo_args(ssh) == NASTY
    assert _echo_args(ssh, extra_env={"X": "1"}) == NASTY
    with pytest.raises(TypeError):
        ssh.run("echo hi; id")


def test_ssh_stdin_rc_stderr_env_cwd(ssh, tmp_path):
    assert ssh.run(["cat"], input="to stdin\n").stdout == "to stdin\n"
    r = ssh.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.rc, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert ssh.run(["no-such-command-gpubox"]).rc == 127
    env = {"GPUBOX_X": "a b;$c 'q'", "GPUBOX_Y": ""}
    assert ssh.run(["sh", "-c", 'printf "%s|%s" "$GPUBOX_X" "$GPUBOX_Y"'], env=env).stdout == "a b;$c 'q'|"
    odd = tmp_path / "dir with 'quote' and $x"
    odd.mkdir()
    assert ssh.run(["pwd"], cwd=str(odd)).stdout.strip() == str(odd)


def test_ssh_large_stdin_echoed_back_does_not_deadlock(ssh):
    data = os.urandom(3 << 20).hex().encode()  # 6 MiB through `cat`: more than SSH's window
    r = ssh.run(["cat"], input=data, timeout=60)
    assert r.rc == 0 and r.stdout.encode() == data


def test_ssh_timeout_is_overall_and_names_host(ssh):
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=r"timed out after 1 s on pve1"):
        # prints steadily, so a per-read timeout would never fire
        ssh.run(["sh", "-c", "while true; do echo tick; sleep 0.1; done"], timeout=1)
    assert time.monotonic() - t0 >= 0.9  # the message says it fired; the command itself never ends
    assert ssh.run(["echo", "still usable"]).stdout == "still usable\n"


def test_ssh_idle_limit_ends_a_silent_command_and_spares_a_talking_one(ssh):
    with pytest.raises(TransportError, match=r"said nothing for 1 s on pve1"):
        ssh.run(SILENT, timeout=120, idle=1, on_stderr=lambda _line: None)
    r = ssh.run(CHATTY, timeout=120, idle=2, on_stderr=lambda _line: None)
    assert r.rc == 0 and r.stdout == "done\n"


def test_ssh_file_protocol(ssh, tmp_path):
    _protocol(ssh, tmp_path)


def test_ssh_reconnects_after_connection_loss(ssh):
    assert ssh.run(["true"]).ok
    ssh.client.get_transport().close()  # the network dropped the connection
    assert ssh.run(["echo", "back"]).stdout == "back\n"
    assert ssh.stat("/") is not None


def test_ssh_unknown_host_key_is_refused_with_the_fix(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    t = sshd.transport("pve1", known_hosts=str(kh))
    with pytest.raises(TransportError) as ei:
        t.run(["true"])
    msg = str(ei.value)
    assert "\n" not in msg and "pve1" in msg and "not in known_hosts" in msg and "refused" in msg
    # The suggested fix is a real command that works.
    fix = msg.split("add it: ", 1)[1].rstrip(")")
    scan, _, dest = fix.partition(" >> ")
    assert dest == str(kh)
    out = subprocess.run(shlex.split(scan), capture_output=True, text=True, timeout=20)
    kh.write_text(out.stdout)
    assert t.run(["echo", "trusted"]).stdout == "trusted\n"


def test_ssh_changed_host_key_is_refused(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    typ, b64 = (tmp_path / "other.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{sshd.host}]:{sshd.port} {typ} {b64}\n")
    with pytest.raises(TransportError, match="does NOT match known_hosts"):
        sshd.transport("pve1", known_hosts=str(kh)).run(["true"])


def test_ssh_host_key_checking_off_connects_to_unknown_host(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    kh = tmp_path / "empty"
    kh.write_text("")
    entry = HostEntry("pve1", sshd.vars(gpubox_known_hosts=str(kh), ansible_ssh_host_key_checking=False))
    t = transport_for(entry)
    with pytest.warns(UserWarning, match="Unknown ssh-ed25519 host key"):  # said, not silent
        assert t.run(["echo", "ok"]).stdout == "ok\n"
    t.close()


def test_ssh_missing_key_file(sshd, tmp_path):
    missing = tmp_path / "nope" / "id_ed25519"
    with pytest.raises(TransportError, match=f"{missing} does not exist"):
        transport_for(HostEntry("pve1", sshd.vars(ansible_ssh_private_key_file=str(missing))))
    with pytest.raises(TransportError, match="does not exist"):
        sshd.transport("pve1", key_filename=str(missing)).run(["true"])


def test_ssh_unauthorized_key(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True
    )
    with pytest.raises(TransportError, match=f"authentication failed for {sshd.user}@127.0.0.1"):
        sshd.transport("pve1", key_filename=str(tmp_path / "stranger")).run(["true"])


def test_ssh_refused_port_names_host(sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(TransportError) as ei:
        SSHTransport("pve9", "127.0.0.1", port, key_filename=str(sshd.key), connect_timeout=30).run(["true"])
    assert f"pve9: cannot reach 127.0.0.1:{port}" in str(ei.value)
    assert time.monotonic() - t0 < 30  # refused at once, not the 30 s connect timeout (no tighter bound)


def test_ssh_silent_host_times_out_naming_host(sshd):
    with socket.socket() as srv:  # accepts TCP, never speaks SSH
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(TransportError) as ei:
            SSHTransport("pve9", "127.0.0.1", port, key_filename=str(sshd.key), connect_timeout=1).run(
                ["true"]
            )
        took = time.monotonic() - t0
    assert f"pve9: cannot reach 127.0.0.1:{port}" in str(ei.value) and "1 s" in str(ei.value)
    assert took >= 0.9  # the 1 s timeout fired (no upper bound: a loaded machine only adds delay)


def test_ssh_second_loopback_address(sshd_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    other = sshd_factory("127.0.0.2")
    assert other.host == "127.0.0.2" and other.host_key_line.startswith("[127.0.0.2]:")
    t = other.transport("pve2")
    r = t.run(["sh", "-c", 'echo "$SSH_CONNECTION"'])
    assert r.stdout.split()[2] == "127.0.0.2"
    t.close()


def test_ssh_host_from_inventory_with_root_prefix_and_backup(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "fakeroot"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")
    inv = Inventory(sshd.write_inventory(tmp_path / "inv.yml", name="pve1", gpubox_root=str(root)))
    h = connect(inv.host("pve1"))
    assert isinstance(h.transport, SSHTransport)
    assert h.read_text("/proc/sys/kernel/numa_balancing") == "1\n"
    saved = h.write("/proc/sys/kernel/numa_balancing", "0\n")
    assert (root / "proc/sys/kernel/numa_balancing").read_text() == "0\n"
    state = Path(os.environ["GPUBOX_STATE_DIR"])
    assert Path(saved).read_text() == "1\n" and Path(saved).is_relative_to(state / "backups" / "pve1")
    h.close()


# ---------------------------------------------------------------------------------- pct
FAKE_PCT = textwrap.dedent("""\
    #!{python}
    # Minimal fake of Proxmox's `pct` for the transport protocol: `exec VMID -- ARGV...` runs ARGV
    # directly (no shell, like lxc-attach), `push VMID SRC DST [--perms OCT]` copies a file.
    import json, os, shutil, sys
    args = sys.argv[1:]
    with open(os.environ["FAKE_PCT_LOG"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    if args[:1] == ["exec"] and len(args) > 3 and args[2] == "--":
        if args[1] != "200":
            sys.exit("Configuration file 'nodes/pve1/lxc/%s.conf' does not exist" % args[1])
        os.execvp(args[3], args[3:])
    if args[:1] == ["push"] and len(args) >= 4:
        src, dst = args[2], args[3]
        shutil.copyfile(src, dst)
        if "--perms" in args:
            os.chmod(dst, int(args[args.index("--perms") + 1], 8))
        sys.exit(0)
    sys.exit("400 unknown command 'pct %s'" % " ".join(args))
""")


@pytest.fixture
def fake_pct(tmp_path):
    bindir = tmp_path / "pctbin"
    bindir.mkdir()
    p = bindir / "pct"
    p.write_text(FAKE_PCT.format(python=sys.executable))
    p.chmod(0o755)
    log = tmp_path / "pct.log"
    log.write_text("")
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "FAKE_PCT_LOG": str(log)}
    return env, log


def _pct_calls(log: Path):
    import json

    return [json.loads(line) for line in log.read_text().splitlines()]


def test_pct_run_goes_through_pct_exec_with_argv_intact(fake_pct):
    env, log = fake_pct
    t = PctTransport("ct200", LocalTransport("pve1"), 200, host_env=env)
    assert _echo_args(t) == NASTY
    assert _pct_calls(log)[0][:4] == ["exec", "200", "--", sys.executable]
    r = t.run(["sh", "-c", 'printf %s "$GPUBOX_X"; exit 4'], env={"GPUBOX_X": "v w"})
    assert (r.rc, r.stdout, r.argv[0], r.host) == (4, "v w", "sh", "ct200")
    assert t.run(["cat"], input="in\n").stdout == "in\n"


def test_pct_passes_the_idle_limit_to_the_host_run(fake_pct):
    """`pct exec` forwards the container command's stderr live, so the host's run bounds its silence."""
    env, _log = fake_pct
    t = PctTransport("ct200", LocalTransport("pve1"), 200, host_env=env)
    with pytest.raises(TransportError, match=r"said nothing for 1 s on pve1"):
        t.run(SILENT, timeout=120, idle=1, on_stderr=lambda _line: None)


def test_pct_file_protocol(fake_pct, tmp_path):
    env, log = fake_pct
    t = PctTransport("ct200", LocalTransport("pve1"), 200, host_env=env)
    d = tmp_path / "ct"
    d.mkdir()
    _protocol(t, d)
    pushes = [c for c in _pct_calls(log) if c[0] == "push"]
    assert pushes and all(c[1] == "200" and c[2].startswith("/tmp/.gpubox-push.gpubox.tmp.") for c in pushes)
    assert ["--perms", "640"] == pushes[0][4:]
    assert pushes[-1][3].endswith("/sub/file.conf.tmp.4242")
    assert not any(Path(c[2]).exists() for c in pushes)  # host temporaries are cleaned up


def test_pct_failure_is_not_file_absent(fake_pct):
    env, _ = fake_pct
    t = PctTransport("ct999", LocalTransport("pve1"), 999, host_env=env)
    with pytest.raises(CommandError, match="does not exist"):
        t.stat("/etc/hostname")


# ---------------------------------------------------------------------------------- Host
def test_host_root_prefix_mapping(tmp_path):
    h = Host(HostEntry("pve1", {"gpubox_root": str(tmp_path)}), LocalTransport("pve1"))
    assert h.path("/etc/pve/lxc/200.conf") == f"{tmp_path}/etc/pve/lxc/200.conf"
    assert h.sysfs_pci == f"{tmp_path}/sys/bus/pci"
    with pytest.raises(ValueError):
        h.path("etc/relative")
    plain = Host(HostEntry("pve1", {}), LocalTransport("pve1"))
    assert plain.path("/proc/devices") == "/proc/devices"


def test_host_write_is_atomic_with_backup_in_state_dir(tmp_path):
    root = tmp_path / "root"
    h = Host(HostEntry("pve1", {"gpubox_root": str(root)}), LocalTransport("pve1"))
    # New file: parent directories created, nothing to back up.
    assert h.write("/etc/sysctl.d/90-gpubox.conf", "kernel.numa_balancing = 0\n") is None
    real = root / "etc/sysctl.d/90-gpubox.conf"
    assert real.read_text() == "kernel.numa_balancing = 0\n"
    real.chmod(0o640)
    saved = h.write("/etc/sysctl.d/90-gpubox.conf", "kernel.numa_balancing = 1\n")
    backups = Path(os.environ["GPUBOX_STATE_DIR"]) / "backups" / "pve1"
    assert Path(saved).parent == backups and Path(saved).read_text() == "kernel.numa_balancing = 0\n"
    assert Path(saved).name.startswith("etc__sysctl.d__90-gpubox.conf.")
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(os.listdir(real.parent)) == ["90-gpubox.conf"]
    h.write("/etc/sysctl.d/90-gpubox.conf", "x\n", backup=False)
    assert len(os.listdir(backups)) == 1
    assert h.read_text("/nope", default="") == ""
    with pytest.raises(FileNotFoundError):
        h.read_text("/nope")


def test_host_bin_dirs_come_first_on_path(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text('#!/bin/sh\necho simulated-smi "$GPUBOX_SIM_SIDE"\n')
    (bindir / "nvidia-smi").chmod(0o755)
    entry = HostEntry("pve1", {"gpubox_bin_dirs": [str(bindir)], "gpubox_env": {"GPUBOX_SIM_SIDE": "host"}})
    h = Host(entry, LocalTransport("pve1"))
    r = h.run(["nvidia-smi"])
    assert (r.stdout, r.host) == ("simulated-smi host\n", "pve1")
    # Only this host's commands see the bin dir; the control node's PATH is untouched.
    assert str(bindir) not in os.environ["PATH"]
    plain = LocalTransport().run(["sh", "-c", "command -v nvidia-smi || true"]).stdout
    assert not plain.startswith(str(bindir))


def test_transport_selection(sshd, tmp_path, fake_pct):
    env, _ = fake_pct
    assert isinstance(transport_for(HostEntry("a", {"ansible_connection": "local"})), LocalTransport)
    assert isinstance(transport_for(HostEntry("a", sshd.vars())), SSHTransport)
    with pytest.raises(InventoryError, match="unsupported connection 'winrm'"):
        transport_for(HostEntry("a", {"ansible_connection": "winrm"}))
    with pytest.raises(InventoryError, match="pct needs"):
        transport_for(HostEntry("ct200", {"gpubox_connection": "pct"}))
    host = HostEntry("pve1", {"ansible_connection": "local", "gpubox_env": env})
    ct = HostEntry("ct200", {"gpubox_connection": "pct", "gpubox_vmid": 200, "gpubox_proxmox_host": "pve1"})
    h, c = connect_box(Box(container=ct, host=host))
    assert isinstance(c.transport, PctTransport) and c.transport.host is h.transport
    assert c.run(["echo", "inside"]).stdout == "inside\n"


def test_sshd_fixture_inventory_works_for_ansible(sshd, tmp_path):
    """The fixture's inventory helper drives real Ansible (OpenSSH client, pinned known_hosts)."""
    inv = sshd.write_inventory(tmp_path / "inv.yml", name="pve1")
    exe = shutil.which("ansible")
    argv = [exe] if exe else [sys.executable, "-m", "ansible.cli.adhoc"]
    r = subprocess.run(
        [*argv, "-i", str(inv), "pve1", "-m", "command", "-a", "printf %s pong"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pve1 | CHANGED | rc=0 >>\npong" in r.stdout


def test_ssh_file_calls_from_two_lanes_at_once(ssh, tmp_path):
    """The host lane and a container-lane step use one host transport at the same time (a CT config
    read while the host lane writes): its one SFTP session must answer each thread its own reply."""
    import concurrent.futures

    files = []
    for i in range(2):
        f = tmp_path / f"f{i}"
        f.write_bytes(bytes([i]) * (50_000 + i))
        files.append(f)

    def work(i):
        for _ in range(40):
            assert ssh.read_bytes(str(files[i])) == files[i].read_bytes()
            assert ssh.stat(str(files[i])).size == 50_000 + i
            ssh.write_bytes_atomic(str(tmp_path / f"w{i}"), b"x" * i, mode=0o600)
        return i

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two lanes, as recover runs them
        futs = [pool.submit(work, i) for i in range(2)]
        done, pending = concurrent.futures.wait(futs, timeout=60)
    assert not pending, "an SFTP call waited forever for a reply another thread took"
    assert sorted(f.result() for f in done) == [0, 1]


def test_ssh_eof_never_follows_the_channels_close(ssh, tmp_path, monkeypatch):
    """A command that ends before its stdin's EOF is sent (the feeding thread descheduled between
    building the EOF and sending it): the CLOSE answered meanwhile must not go out first, or sshd
    drops the whole connection ("ieof packet referred to nonexistent channel") and the other
    lane's SFTP session with it."""
    from paramiko.common import cMSG_CHANNEL_EOF

    send = paramiko.Transport._send_user_message
    late = threading.Event()

    def late_eof(transport, m):
        if (
            late.is_set()
            and m.asbytes()[:1] == cMSG_CHANNEL_EOF
            and threading.current_thread() is not transport
        ):
            time.sleep(1)  # `true` has ended and the server has sent its CLOSE by now
        return send(transport, m)

    f = tmp_path / "f"
    f.write_bytes(b"still here")
    assert ssh.read_bytes(str(f)) == b"still here"  # the SFTP session of this connection
    conn = ssh.client.get_transport()
    monkeypatch.setattr(paramiko.Transport, "_send_user_message", late_eof)
    late.set()
    for _ in range(2):
        assert ssh.run(["true"]).rc == 0
    late.clear()
    assert ssh.read_bytes(str(f)) == b"still here"
    assert ssh.client.get_transport() is conn and conn.is_active(), "the connection was dropped"
