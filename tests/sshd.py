"""A REAL OpenSSH server on loopback for tests (pytest plugin, loaded by tests/conftest.py).

Why real: the SSH transport's promises (argv arrives intact, host keys are verified and an
unknown key is refused, SFTP writes are atomic) only mean something against the sshd that users
run. Each server is `/usr/sbin/sshd -D -e -f <cfg>` with a freshly generated ed25519 host key,
a user key in its own authorized_keys file, StrictModes no and UsePAM no, logging to a file in
its directory. It runs as the current user (root here and in CI; as another user sshd can only
log in that same user).

Fixtures (session-scoped; servers are killed at the end of the session):

    sshd          an SSHServer on 127.0.0.1, free port
    sshd_factory  sshd_factory("127.0.0.2") -> an SSHServer on that loopback address (one per
                  address, started on first use; Linux routes all of 127/8 to lo), for
                  multi-box tests: sshd_factory("127.0.0.2"), sshd_factory("127.0.0.3")

An SSHServer has:

    .host .port .user         where to connect
    .key                      private key file (Path) whose public half is authorized
    .known_hosts              a known_hosts file holding "[HOST]:PORT ssh-ed25519 AAAA..."
    .host_key_line            that line
    .log                      sshd's log (read it when a test fails)
    .vars(**extra)            Ansible/gpubox connection variables for an inventory host:
                              ansible_connection ssh, ansible_host, ansible_port, ansible_user,
                              ansible_ssh_private_key_file, gpubox_known_hosts, and
                              ansible_ssh_common_args pinning OpenSSH (ansible-playbook) to the
                              same known_hosts with StrictHostKeyChecking=yes
    .write_inventory(path, name="pve1", group="proxmox_hosts", **extra)
                              a one-host Ansible YAML inventory using .vars()
    .transport(name="h", **kw) a connected-on-demand gpubox SSHTransport to it

Example:

    def test_over_ssh(sshd, tmp_path):
        inv = sshd.write_inventory(tmp_path / "inv.yml", name="pve1", gpubox_root=str(tmp_path / "root"))
        ...  # gpubox -i inv ... reaches "pve1" over real SSH

Commands run through the user's login shell without ~/.bashrc (SetEnv SHLVL=1), so PATH is
sshd's default: call Python as sys.executable (the vars() set ansible_python_interpreter to it).

Requires openssh-server (sshd, ssh-keygen); tests using it are skipped with a clear reason when
sshd is not installed. /run/sshd (privilege-separation directory) is created when running as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

SSHD = "/usr/sbin/sshd"  # sshd refuses to start unless run by its absolute path
SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
)


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


@dataclass
class SSHServer:
    host: str
    port: int
    user: str
    key: Path
    known_hosts: Path
    host_key_line: str
    dir: Path
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def vars(self, **extra: Any) -> dict[str, Any]:
        """Connection variables for an inventory host reached through this server."""
        v: dict[str, Any] = {
            "ansible_connection": "ssh",
            "ansible_host": self.host,
            "ansible_port": self.port,
            "ansible_user": self.user,
            "ansible_ssh_private_key_file": str(self.key),
            "gpubox_known_hosts": str(self.known_hosts),
            "ansible_ssh_common_args": (
                f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes -o ControlMaster=no"
            ),
            "ansible_python_interpreter": sys.executable,
        }
        v.update(extra)
        return v

    def write_inventory(
        self, path: str | os.PathLike, name: str = "pve1", group: str = "proxmox_hosts", **extra: Any
    ) -> Path:
        """A one-host Ansible YAML inventory whose host `name` is this server."""
        p = Path(path)
        inv = {"all": {"children": {group: {"hosts": {name: self.vars(**extra)}}}}}
        p.write_text(yaml.safe_dump(inv, sort_keys=False))
        return p

    def transport(self, name: str = "sshhost", **kw: Any):
        from gpubox.transport.ssh import SSHTransport

        args = dict(
            hostname=self.host,
            port=self.port,
            user=self.user,
            key_filename=str(self.key),
            known_hosts=str(self.known_hosts),
            connect_timeout=10,
        )
        args.update(kw)
        return SSHTransport(name, **args)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def _wait_ready(srv: SSHServer, deadline: float) -> None:
    """Ready when a TCP connect gets the SSH banner."""
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise RuntimeError(
                f"sshd on {srv.host}:{srv.port} exited {srv.proc.returncode}: {srv.log_text()[-2000:]}"
            )
        try:
            with socket.create_connection((srv.host, srv.port), timeout=1) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"sshd on {srv.host}:{srv.port} not ready in time: {srv.log_text()[-2000:]}")


def start_sshd(base: Path, addr: str = "127.0.0.1", attempts: int = 3, sftp_opts: str = "") -> SSHServer:
    """Start one sshd on `addr` (free port) with keys and config under `base`; `sftp_opts` go to
    its sftp-server (e.g. `-P setstat,fsetstat`: a target that refuses chmod, as pmxcfs does)."""
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    host_key = base / "ssh_host_ed25519_key"
    user_key = base / "id_ed25519"
    if not host_key.exists():
        _keygen(host_key, "gpubox-test-host")
        _keygen(user_key, "gpubox-test-user")
    host_pub = Path(f"{host_key}.pub").read_text().split()
    auth = base / "authorized_keys"
    auth.write_text(Path(f"{user_key}.pub").read_text())
    auth.chmod(0o600)
    sftp = next((p for p in SFTP_SERVERS if os.path.exists(p)), "internal-sftp")
    last = None
    for _ in range(attempts):  # a free port can be taken between probing and binding: retry
        port = _free_port(addr)
        cfg = base / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"ListenAddress {addr}:{port}",
                    f"HostKey {host_key}",
                    f"PidFile {base / 'sshd.pid'}",
                    f"AuthorizedKeysFile {auth}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "StrictModes no",
                    "UsePAM no",
                    "UseDNS no",
                    "PrintMotd no",
                    # bash sources ~/.bashrc for SSH commands only at SHLVL < 2: skip it (a pyenv init
                    # there costs ~0.2 s per command), like a non-interactive login on a plain server.
                    "SetEnv SHLVL=1",
                    "MaxStartups 100:30:200",
                    "MaxSessions 100",
                    "LogLevel VERBOSE",
                    f"Subsystem sftp {sftp} {sftp_opts}".rstrip(),
                    "",
                ]
            )
        )
        log = base / "sshd.log"
        logf = open(log, "ab")
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(cfg)],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        logf.close()
        kh = base / "known_hosts"
        line = f"[{addr}]:{port} {host_pub[0]} {host_pub[1]}"
        kh.write_text(line + "\n")
        srv = SSHServer(addr, port, _user(), user_key, kh, line, base, log, proc)
        try:
            _wait_ready(srv, time.monotonic() + 15)
            return srv
        except RuntimeError as exc:
            last = exc
            srv.stop()
    raise RuntimeError(str(last))


def _require_sshd() -> None:
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed (apt-get install openssh-server; .ci/run does)")


@pytest.fixture(scope="session")
def sshd_factory(tmp_path_factory):
    """sshd_factory(addr="127.0.0.1") -> SSHServer, one per loopback address, killed at session end."""
    servers: dict[str, SSHServer] = {}

    def get(addr: str = "127.0.0.1") -> SSHServer:
        _require_sshd()
        if addr not in servers:
            servers[addr] = start_sshd(tmp_path_factory.mktemp(f"sshd-{addr.replace('.', '_')}"), addr)
        srv = servers[addr]
        if srv.proc.poll() is not None:
            raise RuntimeError(f"sshd on {addr} died: {srv.log_text()[-2000:]}")
        return srv

    yield get
    for srv in servers.values():
        srv.stop()


@pytest.fixture(scope="session")
def sshd(sshd_factory) -> SSHServer:
    """A real sshd on 127.0.0.1 (see the module docstring)."""
    return sshd_factory("127.0.0.1")


def container_over_ssh(inventory_path: Path, box: str, server: "SSHServer") -> None:
    """Point a simulated box's container entry at the real sshd (drops the local connection and the
    stand-in bin dirs), so the container is reached as on a real box."""
    inv = yaml.safe_load(inventory_path.read_text())
    ct = inv["all"]["children"]["gpu_containers"]["hosts"][box]
    for k in ("ansible_connection", "gpubox_bin_dirs"):
        ct.pop(k, None)
    ct.update(server.vars())
    inventory_path.write_text(yaml.safe_dump(inv))
