"""Run inside an LXC container with `pct exec <vmid> --` through its Proxmox host's transport.

Files are read with `cat`, written by pushing a temporary file with `pct push` and renaming it
inside the container (atomic there), and stat'ed with `stat -c`.
"""

from __future__ import annotations

import base64
import posixpath
import stat as _stat
from typing import Mapping, Sequence

from .. import readlimit, safeio
from .base import CmdResult, FileStat, Held, LineCallback, Transport, validate_argv


class PctTransport(Transport):
    def __init__(self, name: str, host: Transport, vmid: int, host_env: Mapping[str, str] | None = None):
        self.name = name
        self.host = host
        self.vmid = int(vmid)
        self.host_env = dict(host_env or {})  # env for `pct` itself on the host (e.g. PATH)

    def _pct(
        self,
        *args: str,
        timeout: float = 60,
        input=None,
        on_stderr: LineCallback | None = None,
        idle: float | None = None,
    ) -> CmdResult:
        # `pct exec` execs lxc-attach in its own process (pve-container src/PVE/CLI/pct.pm, method exec:
        # `exec(@lxc_attach_cmd)`, commit 94f5585), so the command's stderr reaches the host transport
        # unbuffered and its live lines are the container's.
        return self.host.run(
            ["pct", *args],
            timeout=timeout,
            input=input,
            env=self.host_env or None,
            become=True,
            on_stderr=on_stderr,
            idle=idle,
        )

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
        inner = list(argv)
        if env:
            inner = ["env", *[f"{k}={v}" for k, v in env.items()], *inner]
        if cwd:
            inner = ["env", "-C", cwd, *inner]
        r = self._pct(
            "exec", str(self.vmid), "--", *inner, timeout=timeout, input=input, on_stderr=on_stderr, idle=idle
        )
        return CmdResult(list(argv), r.rc, r.stdout, r.stderr, r.seconds, self.name)

    def hold(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Held:
        """Through `pct exec` on the host (lxc-attach passes stdin on, so EOF still ends it)."""
        inner = list(validate_argv(argv))
        if env:
            inner = ["env", *[f"{k}={v}" for k, v in env.items()], *inner]
        return self.host.hold(["pct", "exec", str(self.vmid), "--", *inner], env=self.host_env or None)

    def read_bytes(self, path: str) -> bytes:
        # base64 because the host transport hands back decoded text: raw `cat` would mangle any
        # byte that is not UTF-8.
        # One call: find(1) prints the file's type and size, and only a regular file under the
        # bound is read at all (a FIFO would block base64, /dev/zero would never end).
        limit = readlimit.HOST_FILE_LIMIT
        r = self.run(
            [
                "find",
                "-L",
                path,
                "-maxdepth",
                "0",
                "-printf",
                "%y %s\\n",
                "-type",
                "f",
                "-size",
                f"-{limit + 1}c",
                "-exec",
                "base64",
                "-w0",
                "--",
                "{}",
                ";",
            ]
        )
        if r.rc != 0 or not r.stdout:
            if "No such file" in r.stderr:
                raise FileNotFoundError(path)
            r.check()
        head, _, body = r.stdout.partition("\n")
        kind, _, size = head.partition(" ")
        where = f"{self.name}:{path}"
        if kind in ("N", "L"):  # a dangling link: missing, as base64 would have said
            raise FileNotFoundError(path)
        if kind != "f":
            raise readlimit.NotRegular(
                f"{where} is {_FIND_KINDS.get(kind, 'not a regular file')}, not a regular file",
                "give a regular file",
            )
        if not size.isdigit() or int(size) > limit:
            raise readlimit.too_large(where, limit, "file", int(size) if size.isdigit() else None)
        return base64.b64decode(body)

    def write_bytes_atomic(
        self, path: str, data: bytes, mode: int | None = None, tmp_name: str | None = None
    ) -> None:
        host_tmp = f"/tmp/{safeio.tmp_name('gpubox-push')}"
        ct_tmp = posixpath.join(posixpath.dirname(path), tmp_name or safeio.tmp_name(path))
        if mode is None:  # keep the old file's permissions, like the other transports
            old = self.stat(path)
            mode = old.perms if old else 0o644
        self.refuse_links(posixpath.dirname(path) or "/")
        self.host.write_bytes_atomic(host_tmp, data, mode=0o600)
        try:
            args = ["push", str(self.vmid), host_tmp, ct_tmp, "--perms", oct(mode)[2:]]
            self._pct(*args).check()
            # -T: a directory (or a link to one) at PATH is an error, never a place to move into;
            # rename(2) replaces a link at PATH itself instead of following it.
            self.run(["mv", "-fT", "--", ct_tmp, path]).check()
        finally:
            try:
                self.host.remove(host_tmp)
            except OSError:
                pass

    def stat(self, path: str) -> FileStat | None:
        r = self.run(["stat", "-c", "%f %s %Y %u %g %t %T", "--", path])
        if r.rc != 0:
            if "No such file" in r.stderr:
                return None
            r.check()  # a stopped container or a broken pct is not "file absent"
        f, size, mtime, uid, gid, ma, mi = r.stdout.split()
        fs = FileStat(path, int(f, 16), int(size), float(mtime), int(uid), int(gid))
        if fs.is_char_device or _stat.S_ISBLK(fs.mode):
            fs.rdev = (int(ma, 16), int(mi, 16))
        return fs

    def listdir(self, path: str) -> list[str]:
        r = self.run(["ls", "-1A", "--", path]).check()
        return sorted(x for x in r.stdout.splitlines() if x)

    def makedirs(self, path: str, mode: int = 0o755) -> None:
        self.refuse_links(path)
        self.run(["mkdir", "-p", "-m", oct(mode)[2:], "--", path]).check()

    def remove(self, path: str) -> None:
        """rm -f is unlink(2): a link is removed, never its target; no link on the way."""
        self.refuse_links(posixpath.dirname(path) or "/")
        self.run(["rm", "-f", "--", path]).check()


# find(1) -printf %y letters -> words
_FIND_KINDS = {
    "p": "a FIFO (named pipe)",
    "c": "a character device",
    "b": "a block device",
    "s": "a socket",
    "d": "a directory",
}
