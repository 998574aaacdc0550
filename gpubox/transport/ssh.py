"""SSH transport over paramiko: host keys verified against known_hosts (RejectPolicy) by default.

Commands travel as argv joined with shlex.quote (SSH's exec request carries one string; quoting
each element keeps it an argv). Files go through SFTP; writes land in a temporary file in the
same directory and are renamed with posix-rename so readers never see half a file.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import socket
import stat as _stat
import threading
import time
from typing import Mapping, Sequence

import paramiko

from ..errors import TransportError
from .base import CmdResult, FileStat, Transport, validate_argv


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


class SSHTransport(Transport):
    def __init__(self, name: str, hostname: str, port: int = 22, user: str | None = None,
                 key_filename: str | None = None, known_hosts: str | None = None,
                 verify_host_key: bool = True, connect_timeout: float = 10,
                 become: bool = False, password: str | None = None):
        self.name = name
        self.hostname, self.port, self.user = hostname, int(port), user
        self.key_filename = os.path.expanduser(key_filename) if key_filename else None
        self.known_hosts = os.path.expanduser(known_hosts) if known_hosts else None
        self.verify_host_key = verify_host_key
        self.connect_timeout = connect_timeout
        self.default_become = become
        self._password = password
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_vars(cls, name: str, v: Mapping) -> "SSHTransport":
        """Build from Ansible connection variables."""
        key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
        if key and not os.path.exists(os.path.expanduser(str(key))):
            raise TransportError(f"{name}: ansible_ssh_private_key_file {key} does not exist",
                                 "fix the path or remove it to use ssh-agent / default keys")
        check = v.get("ansible_ssh_host_key_checking", v.get("ansible_host_key_checking", True))
        pw_env = v.get("gpubox_ssh_password_env")
        return cls(
            name=name,
            hostname=str(v.get("ansible_host") or name),
            port=int(v.get("ansible_port") or v.get("ansible_ssh_port") or 22),
            user=v.get("ansible_user") or v.get("ansible_ssh_user"),
            key_filename=str(key) if key else None,
            known_hosts=v.get("gpubox_known_hosts"),
            verify_host_key=_truthy(check),
            connect_timeout=float(v.get("ansible_ssh_timeout") or v.get("ansible_timeout") or 10),
            become=_truthy(v.get("ansible_become", False)),
            password=os.environ.get(pw_env) if pw_env else None,
        )

    # -- connection ------------------------------------------------------------------------
    @property
    def client(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self) -> paramiko.SSHClient:
        c = paramiko.SSHClient()
        c.load_system_host_keys()
        kh = self.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        if os.path.exists(kh):
            c.load_host_keys(kh)
        c.set_missing_host_key_policy(paramiko.RejectPolicy() if self.verify_host_key
                                      else paramiko.WarningPolicy())
        where = f"{self.hostname}:{self.port}"
        try:
            c.connect(self.hostname, port=self.port, username=self.user, key_filename=self.key_filename,
                      password=self._password, timeout=self.connect_timeout,
                      banner_timeout=self.connect_timeout, auth_timeout=self.connect_timeout,
                      allow_agent=True, look_for_keys=self.key_filename is None)
        except paramiko.BadHostKeyException:
            raise TransportError(f"{self.name}: host key of {where} does NOT match known_hosts",
                                 "the host was reinstalled or this is an attack: verify, then fix known_hosts") from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise TransportError(f"{self.name}: host key of {where} is not in known_hosts ({kh})",
                                     f"verify it, then add it: ssh-keyscan -p {self.port} {self.hostname} >> {kh}") from None
            if isinstance(exc, paramiko.AuthenticationException):
                raise TransportError(f"{self.name}: SSH authentication failed for {self.user or 'default user'}@{where}",
                                     "check ansible_user and ansible_ssh_private_key_file or ssh-agent") from None
            raise TransportError(f"{self.name}: SSH to {where} failed: {exc}",
                                 "check that sshd runs there") from None
        except (socket.timeout, TimeoutError):
            raise TransportError(f"{self.name}: cannot reach {where}: timed out after {self.connect_timeout:g} s",
                                 "check ansible_host/ansible_port and the network") from None
        except (OSError, paramiko.ssh_exception.NoValidConnectionsError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            raise TransportError(f"{self.name}: cannot reach {where}: {reason}",
                                 "check ansible_host/ansible_port and that sshd runs there") from None
        return c

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- commands --------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float = 60, input: bytes | str | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            become: bool = False) -> CmdResult:
        argv = validate_argv(argv)
        cmd = list(argv)
        if env:
            cmd = ["env", *[f"{k}={v}" for k, v in env.items()], *cmd]
        if (become or self.default_become) and self.user not in (None, "root"):
            cmd = ["sudo", "-n", "--", *cmd]
        line = shlex.join(cmd)
        if cwd:
            line = f"cd {shlex.quote(cwd)} && {line}"
        t0 = time.monotonic()
        try:
            chan = self.client.get_transport().open_session(timeout=self.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(line)
            if input is not None:
                chan.sendall(input.encode() if isinstance(input, str) else input)
            chan.shutdown_write()
            err_chunks: list[bytes] = []

            def _drain_err():  # stderr in a thread so a chatty command cannot stall stdout
                try:
                    while True:
                        b = chan.recv_stderr(65536)
                        if not b:
                            break
                        err_chunks.append(b)
                except socket.timeout:
                    pass

            th = threading.Thread(target=_drain_err, daemon=True)
            th.start()
            out_chunks = []
            while True:
                b = chan.recv(65536)
                if not b:
                    break
                out_chunks.append(b)
            rc = chan.recv_exit_status()
            th.join(timeout=5)
            chan.close()
        except socket.timeout:
            raise TransportError(f"`{' '.join(argv)}` timed out after {timeout:g} s on {self.name}",
                                 "raise the timeout or check what the command waits for") from None
        return CmdResult(list(argv), rc, b"".join(out_chunks).decode(errors="replace"),
                         b"".join(err_chunks).decode(errors="replace"), time.monotonic() - t0, self.name)

    # -- files -----------------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        try:
            with self.sftp.open(path, "rb") as f:
                return f.read()
        except IOError as exc:
            if getattr(exc, "errno", None) == 2:
                raise FileNotFoundError(path) from None
            raise

    def write_bytes_atomic(self, path: str, data: bytes, mode: int | None = None,
                           tmp_name: str | None = None) -> None:
        d = posixpath.dirname(path) or "."
        tmp = posixpath.join(d, tmp_name or f".{posixpath.basename(path)}.gpubox.{os.getpid()}.tmp")
        if mode is None:
            old = self.stat(path)
            mode = old.perms if old else 0o644
        try:
            with self.sftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                f.write(data)
            self.sftp.chmod(tmp, mode)
            self.sftp.posix_rename(tmp, path)
        except BaseException:
            try:
                self.sftp.remove(tmp)
            except IOError:
                pass
            raise

    def stat(self, path: str) -> FileStat | None:
        try:
            st = self.sftp.lstat(path)
        except IOError as exc:
            if getattr(exc, "errno", None) == 2:
                return None
            raise
        fs = FileStat(path, st.st_mode or 0, st.st_size or 0, float(st.st_mtime or 0),
                      st.st_uid or 0, st.st_gid or 0)
        if _stat.S_ISCHR(fs.mode) or _stat.S_ISBLK(fs.mode):
            # SFTP does not carry st_rdev: ask stat(1) for major:minor (hex).
            r = self.run(["stat", "-c", "%t %T", path])
            if r.ok:
                ma, mi = r.stdout.split()
                fs.rdev = (int(ma, 16), int(mi, 16))
        return fs

    def listdir(self, path: str) -> list[str]:
        return sorted(self.sftp.listdir(path))

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.run(["mkdir", "-p", "-m", oct(mode)[2:], path]).check()

    def remove(self, path: str) -> None:
        self.sftp.remove(path)
