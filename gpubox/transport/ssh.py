"""SSH transport over paramiko: host keys verified against known_hosts (RejectPolicy) by default.

One module (about 530 lines): the paramiko session, its SFTP writes and its command runner share one
connection's state and lifetime.

Commands travel as argv joined with shlex.quote (SSH's exec request carries one string; quoting
each element keeps it an argv). Files go through SFTP; writes land in a temporary file in the
same directory and are renamed with posix-rename so readers never see half a file.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import select
import shlex
import socket
import stat as _stat
import threading
import time
from typing import Mapping, Sequence

import paramiko

from .. import readlimit, safeio
from ..errors import TransportError
from .base import (
    CmdResult,
    FileStat,
    Held,
    LineCallback,
    LineSplitter,
    Transport,
    idle_error,
    validate_argv,
)

# paramiko logs handshake failures from its own thread; without a handler Python's last-resort
# handler would print them as a traceback-like blurb next to our one-line error.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


class SSHTransport(Transport):
    def __init__(
        self,
        name: str,
        hostname: str,
        port: int = 22,
        user: str | None = None,
        key_filename: str | None = None,
        known_hosts: str | None = None,
        verify_host_key: bool = True,
        connect_timeout: float = 10,
        become: bool = False,
        password: str | None = None,
    ):
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
        # One SFTP session per connection, used by both lanes (a container-lane step reads the CT
        # config through the host's transport while the host lane writes there): paramiko's
        # SFTPClient matches replies to requests on one channel and two threads waiting on it at
        # once can each take the other's reply and wait forever. Every SFTP use holds this lock.
        self._sftp_lock = threading.RLock()

    @classmethod
    def from_vars(cls, name: str, v: Mapping) -> "SSHTransport":
        """Build from Ansible connection variables."""
        key = v.get("ansible_ssh_private_key_file") or v.get("ansible_private_key_file")
        if key and not os.path.exists(os.path.expanduser(str(key))):
            raise TransportError(
                f"{name}: ansible_ssh_private_key_file {key} does not exist",
                "fix the path or remove it to use ssh-agent / default keys",
            )
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
        where = f"{self.hostname}:{self.port}"
        if self.key_filename and not os.path.exists(self.key_filename):
            raise TransportError(
                f"{self.name}: SSH key file {self.key_filename} does not exist",
                "fix ansible_ssh_private_key_file or remove it to use ssh-agent / default keys",
            )
        c = paramiko.SSHClient()
        kh = self.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        revoked: list = []
        for f in dict.fromkeys([os.path.expanduser("~/.ssh/known_hosts"), kh]):
            if os.path.exists(f):
                revoked += load_known_hosts(c.get_host_keys(), f, self.name)
        c.set_missing_host_key_policy(
            _RevokedAwarePolicy(revoked, self.name, where)
            if self.verify_host_key
            else paramiko.WarningPolicy()
        )
        # Our own TCP connect: refused / timed out / no route map to one clear message naming the
        # host, before paramiko's handshake errors get involved.
        try:
            sock = socket.create_connection((self.hostname, self.port), timeout=self.connect_timeout)
        except (socket.timeout, TimeoutError):
            raise TransportError(
                f"{self.name}: cannot reach {where}: timed out after {self.connect_timeout:g} s",
                "check ansible_host/ansible_port and the network",
            ) from None
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise TransportError(
                f"{self.name}: cannot reach {where}: {reason}",
                "check ansible_host/ansible_port and that sshd runs there",
            ) from None
        # An sshd speaks first (its version banner, RFC 4253 4.2): silence means this is not a
        # working sshd, which paramiko would only report as "No existing session".
        if not select.select([sock], [], [], self.connect_timeout)[0]:
            sock.close()
            raise TransportError(
                f"{self.name}: cannot reach {where}: no SSH banner within {self.connect_timeout:g} s",
                "check ansible_host/ansible_port point at a running sshd",
            ) from None
        try:
            c.connect(
                self.hostname,
                port=self.port,
                username=self.user,
                key_filename=self.key_filename,
                password=self._password,
                timeout=self.connect_timeout,
                sock=sock,
                banner_timeout=self.connect_timeout,
                auth_timeout=self.connect_timeout,
                allow_agent=True,
                look_for_keys=self.key_filename is None,
            )
        except TransportError:
            c.close()
            raise
        except paramiko.BadHostKeyException:
            c.close()
            raise TransportError(
                f"{self.name}: host key of {where} does NOT match known_hosts ({kh})",
                "the host was reinstalled or this is an attack: verify, then fix known_hosts",
            ) from None
        except paramiko.AuthenticationException:
            c.close()
            raise TransportError(
                f"{self.name}: SSH authentication failed for {self.user or 'default user'}@{where}",
                "check ansible_user and ansible_ssh_private_key_file or ssh-agent",
            ) from None
        except paramiko.SSHException as exc:
            inner = getattr(c.get_transport(), "saved_exception", None)
            c.close()
            if "not found in known_hosts" in str(exc):
                keyscan = (
                    f"ssh-keyscan -p {self.port} {self.hostname}"
                    if self.port != 22
                    else f"ssh-keyscan {self.hostname}"
                )
                raise TransportError(
                    f"{self.name}: host key of {where} is not in known_hosts ({kh}); refused",
                    f"verify it, then add it: {keyscan} >> {kh}",
                ) from None
            if "banner" in f"{inner} {exc}":
                raise TransportError(
                    f"{self.name}: cannot reach {where}: no SSH banner within {self.connect_timeout:g} s",
                    "check ansible_host/ansible_port point at an sshd",
                ) from None
            raise TransportError(
                f"{self.name}: SSH to {where} failed: {inner or exc}", "check that sshd runs there"
            ) from None
        except (socket.timeout, TimeoutError):
            c.close()
            raise TransportError(
                f"{self.name}: cannot reach {where}: timed out after {self.connect_timeout:g} s",
                "check ansible_host/ansible_port and the network",
            ) from None
        except OSError as exc:
            c.close()
            reason = getattr(exc, "strerror", None) or str(exc)
            raise TransportError(
                f"{self.name}: SSH to {where} failed: {reason}", "check the key file and that sshd runs there"
            ) from None
        return c

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is not None and self._sftp.get_channel().closed:
            self._drop()  # the connection went away: reconnect below
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
    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60,
        input: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        become: bool = False,
        on_stderr: LineCallback | None = None,
        idle: float | None = None,
    ) -> CmdResult:
        argv = validate_argv(argv)
        cmd = list(argv)
        if env:
            cmd = ["env", *[f"{k}={v}" for k, v in env.items()], *cmd]
        if (become or self.default_become) and self.user not in (None, "root"):
            cmd = ["sudo", "-n", "--", *cmd]
        line = shlex.join(cmd)
        if cwd:
            line = f"cd {shlex.quote(cwd)} && {line}"
        data = input.encode() if isinstance(input, str) else input
        t0 = time.monotonic()
        chan = self._session()
        timed_out = threading.Event()
        went_idle = threading.Event()
        finished = threading.Event()
        lines = LineSplitter(on_stderr)

        def _watch():  # one deadline for the whole command (not per read), and the idle one
            deadline = time.monotonic() + timeout
            while not finished.wait(max(0.0, min(1.0, deadline - time.monotonic()))):
                now = time.monotonic()
                if idle is not None and now - lines.last >= idle:
                    went_idle.set()
                elif now < deadline:
                    continue
                timed_out.set()
                chan.close()
                return

        timer = threading.Thread(target=_watch, daemon=True)
        err_chunks: list[bytes] = []
        out_chunks: list[bytes] = []

        def _feed():  # stdin in a thread: a command echoing its input must not deadlock us
            try:
                if data:
                    chan.sendall(data)
                shutdown_write(chan)
            except (OSError, EOFError, paramiko.SSHException):
                pass

        def _drain_err():  # stderr in a thread so a chatty command cannot stall stdout
            while True:
                b = chan.recv_stderr(65536)
                if not b:
                    break
                err_chunks.append(b)
                lines.feed(b)  # live: the remote side's progress lines
            lines.flush()

        try:
            timer.start()
            chan.exec_command(line)
            threads = [threading.Thread(target=f, daemon=True) for f in (_feed, _drain_err)]
            for th in threads:
                th.start()
            while True:
                b = chan.recv(65536)
                if not b:
                    break
                out_chunks.append(b)
            rc = chan.recv_exit_status()
            for th in threads:
                th.join(timeout=5)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if not timed_out.is_set():
                self._drop()
                raise TransportError(
                    f"{self.name}: SSH session to {self.hostname}:{self.port} broke: {exc}",
                    "check the host and re-run",
                ) from None
        finally:
            finished.set()
            chan.close()
        if went_idle.is_set():
            raise idle_error(argv, idle, self.name)
        if timed_out.is_set():
            raise TransportError(
                f"`{' '.join(argv)}` timed out after {timeout:g} s on {self.name}",
                "raise the timeout or check what the command waits for",
            )
        return CmdResult(
            list(argv),
            rc,
            b"".join(out_chunks).decode(errors="replace"),
            b"".join(err_chunks).decode(errors="replace"),
            time.monotonic() - t0,
            self.name,
        )

    def hold(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Held:
        """ARGV in its own channel, stdin open. When this process dies the TCP connection drops,
        sshd closes the session's pipes and the command reads EOF: a dead control node holds nothing."""
        argv = validate_argv(argv)
        cmd = list(argv)
        if env:
            cmd = ["env", *[f"{k}={v}" for k, v in env.items()], *cmd]
        chan = self._session()
        try:
            chan.exec_command(shlex.join(cmd))
        except (EOFError, OSError, paramiko.SSHException) as exc:
            chan.close()
            raise TransportError(
                f"{self.name}: cannot start `{shlex.join(argv)}`: {exc}", "check the host"
            ) from None
        return _SSHHeld(chan)

    def _session(self) -> paramiko.Channel:
        """A new exec channel; reconnects once when the old connection has gone away."""
        for attempt in (0, 1):
            t = self.client.get_transport()
            if t is not None and t.is_active():
                try:
                    return t.open_session(timeout=self.connect_timeout)
                except (EOFError, OSError, paramiko.SSHException) as exc:
                    if attempt:
                        raise TransportError(
                            f"{self.name}: cannot open an SSH session on {self.hostname}:{self.port}: {exc}",
                            "check sshd's MaxSessions and that the host is up",
                        ) from None
            self._drop()
        raise TransportError(
            f"{self.name}: SSH connection to {self.hostname}:{self.port} is gone", "check the host and re-run"
        )

    def _drop(self) -> None:
        with self._lock:
            try:
                self.close()
            except Exception:
                self._client = self._sftp = None

    # -- files -----------------------------------------------------------------------------
    def read_bytes(self, path: str) -> bytes:
        with self._sftp_lock:
            return self._read_bytes(path)

    def _read_bytes(self, path: str) -> bytes:
        try:
            # stat first: SFTP's open of a FIFO blocks on the server, /dev/zero never ends.
            st = self.sftp.stat(path)
            if st.st_mode is not None and not _stat.S_ISREG(st.st_mode):
                raise readlimit.NotRegular(
                    f"{self.name}:{path} is {readlimit.kind_of(st.st_mode)}, not a regular file",
                    "give a regular file",
                )
            with self.sftp.open(path, "rb") as f:
                data = f.read(readlimit.HOST_FILE_LIMIT + 1)
            if len(data) > readlimit.HOST_FILE_LIMIT:
                raise readlimit.too_large(f"{self.name}:{path}", readlimit.HOST_FILE_LIMIT, "file", None)
            return data
        except IOError as exc:
            if getattr(exc, "errno", None) == 2:
                raise FileNotFoundError(path) from None
            raise

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: int | None = None, tmp_name: str | None = None
    ) -> None:
        d = posixpath.dirname(path) or "."
        self.refuse_links(d)  # no link on the way (the directories gpubox writes are root's)
        tmp = posixpath.join(d, tmp_name or safeio.tmp_name(path))
        asked = mode is not None
        if mode is None:  # keep the mode of the file replaced; a new file gets the target's own
            old = self.stat(path)
            mode = old.perms if old and old.is_file else None
        with self._sftp_lock:
            self._write_tmp_and_rename(tmp, path, data, mode, asked)

    def _write_tmp_and_rename(self, tmp: str, path: str, data: bytes, mode: int | None, asked: bool) -> None:
        try:
            with self.sftp.open(tmp, "wxb") as f:  # O_CREAT|O_EXCL: never through a planted symlink
                f.set_pipelined(True)
                f.write(data)
                if mode is not None:
                    self._set_mode(f, mode, asked)  # fsetstat on our handle, never by name
            self.sftp.posix_rename(tmp, path)
        except BaseException:
            try:
                self.sftp.remove(tmp)
            except IOError:
                pass
            raise

    @staticmethod
    def _set_mode(f, mode: int, asked: bool) -> None:
        """chmod (fsetstat on our own handle) only where the new file's mode differs. A target that
        refuses it (Proxmox's pmxcfs: EPERM, or EACCES through sftp-server; it shows 0640 whatever
        is asked) is accepted when no mode was asked (only the replaced file's was kept), or when
        the file got a mode pmxcfs gives (0640, 0600 under priv/: pve-cluster src/pmxcfs/pmxcfs.c
        cfs_fuse_chmod) that grants nothing beyond the mode asked; else the refusal stands."""
        have = f.stat().st_mode & 0o7777
        if have == mode & 0o7777:
            return
        try:
            f.chmod(mode)
        except IOError as exc:
            if getattr(exc, "errno", None) not in (errno.EPERM, errno.EACCES):
                raise
            if asked and (have not in (0o640, 0o600) or have & ~mode & 0o7777):
                raise

    def stat(self, path: str) -> FileStat | None:
        try:
            with self._sftp_lock:
                st = self.sftp.lstat(path)
        except IOError as exc:
            if getattr(exc, "errno", None) == 2:
                return None
            raise
        fs = FileStat(
            path, st.st_mode or 0, st.st_size or 0, float(st.st_mtime or 0), st.st_uid or 0, st.st_gid or 0
        )
        if _stat.S_ISCHR(fs.mode) or _stat.S_ISBLK(fs.mode):
            # SFTP does not carry st_rdev: ask stat(1) for major:minor (hex).
            r = self.run(["stat", "-c", "%t %T", path])
            if r.ok:
                ma, mi = r.stdout.split()
                fs.rdev = (int(ma, 16), int(mi, 16))
        return fs

    def listdir(self, path: str) -> list[str]:
        with self._sftp_lock:
            return sorted(self.sftp.listdir(path))

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.refuse_links(path)
        self.run(["mkdir", "-p", "-m", oct(mode)[2:], "--", path]).check()

    def remove(self, path: str) -> None:
        """SFTP remove is unlink(2): a link is removed, never its target; no link on the way."""
        self.refuse_links(posixpath.dirname(path) or "/")
        with self._sftp_lock:
            self.sftp.remove(path)


def load_known_hosts(keys: "paramiko.HostKeys", path: str, name: str) -> list:
    """Load an OpenSSH known_hosts file into KEYS; return its @revoked keys.

    paramiko reads neither markers (`@revoked`, `@cert-authority`: InvalidHostKey) nor non-UTF-8
    bytes (UnicodeDecodeError), and would end the run with an internal error. Like OpenSSH
    (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT"), a malformed line is skipped; a revoked key is never
    trusted, even when another line lists it; certificate authorities are not supported, so those
    lines trust nothing. Non-UTF-8 bytes are a one-line error naming the file and line."""
    from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

    try:
        data = open(path, "rb").read()
    except OSError as exc:
        raise TransportError(
            f"{name}: cannot read known_hosts {path}: {exc.strerror}", "check its permissions"
        ) from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TransportError(
            f"{name}: known_hosts {path} line {line} is not UTF-8 text",
            "remove or fix that line (ssh-keygen -R HOST)",
        ) from None
    revoked, trusted = [], []
    for raw in text.splitlines():
        line = raw.strip()
        marker = None
        if line.startswith("@"):
            marker, _, line = line.partition(" ")
        try:
            entry = HostKeyEntry.from_line(line.strip()) if line and not line.startswith("#") else None
        except (InvalidHostKey, paramiko.SSHException, ValueError, IndexError, UnicodeError, TypeError):
            entry = None
        if entry is None or entry.key is None:
            continue
        if marker == "@revoked":
            revoked.append(entry.key)
        elif marker is None:
            trusted.append(entry)
    bad = {(k.get_name(), k.asbytes()) for k in revoked}
    for e in trusted:
        if (e.key.get_name(), e.key.asbytes()) in bad:
            continue
        for host in e.hostnames:
            keys.add(host, e.key.get_name(), e.key)
    return revoked


class _RevokedAwarePolicy(paramiko.MissingHostKeyPolicy):
    """RejectPolicy that says so when the unknown key is one known_hosts marks @revoked."""

    def __init__(self, revoked: list, name: str, where: str):
        self.revoked = {(k.get_name(), k.asbytes()) for k in revoked}
        self.name, self.where = name, where

    def missing_host_key(self, client, hostname, key):
        if (key.get_name(), key.asbytes()) in self.revoked:
            raise TransportError(
                f"{self.name}: host key of {self.where} is marked @revoked in known_hosts; refused",
                "the key was revoked on purpose: verify the host before trusting a new key",
            )
        raise paramiko.SSHException(f"Server {hostname!r} not found in known_hosts")


def shutdown_write(chan: paramiko.Channel) -> None:
    """Send the channel's EOF, never after its CLOSE.

    paramiko's Channel.shutdown_write builds the EOF under the channel's lock and sends it after
    letting the lock go. When the command has already ended, the transport thread answers the
    server's CLOSE in that gap, the EOF goes out after it, and OpenSSH drops the whole connection
    ("ieof packet referred to nonexistent channel"): every other channel on it, the SFTP session
    of the other lane included, breaks (paramiko issues #1115 and #1705, open). Holding the lock
    until the EOF is sent keeps the order, as paramiko-ng's fix (#101) does; a channel already
    closed gets no EOF. Where paramiko's internals differ, its own call is the fallback."""
    build = getattr(chan, "_send_eof", None)
    send = getattr(getattr(chan, "transport", None), "_send_user_message", None)
    lock = getattr(chan, "lock", None)
    if build is None or send is None or lock is None:
        chan.shutdown_write()
        return
    with lock:
        if chan.closed:
            return
        m = build()
        if m is not None:
            send(m)


class _SSHHeld(Held):
    def __init__(self, chan: paramiko.Channel):
        super().__init__()
        self.chan = chan
        self._start()

    def _read(self) -> bytes:
        return self.chan.recv(4096)

    def _close_stdin(self) -> None:
        shutdown_write(self.chan)

    def _poll(self) -> int | None:
        if self.chan.exit_status_ready():
            rc = self.chan.recv_exit_status()
            self.chan.close()
            return rc
        return None

    def _kill(self) -> None:
        self.chan.close()

    def stderr_text(self) -> str:
        out = b""
        while self.chan.recv_stderr_ready():
            out += self.chan.recv_stderr(65536)
        return out.decode(errors="replace")
