"""Helpers of the copier's tests: a model to stage, staging it, a killed run, a cold source."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import copier, readers, room
from gpubox.simbox.model import make_model


def _stage(src, dest, **kw):
    kw.setdefault("workers", 2)
    return st.stage(str(src), str(dest), **kw)


def _files(d: Path):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def _flip_byte(path: Path, back: int = 5) -> None:
    """Flip one tensor byte near the end, keeping size and mtime (what stat cannot see)."""
    s0 = path.stat()
    with open(path, "r+b") as f:
        f.seek(s0.st_size - back)
        b = f.read(1)
        f.seek(s0.st_size - back)
        f.write(bytes([b[0] ^ 0x01]))
    os.utime(path, ns=(s0.st_atime_ns, s0.st_mtime_ns))


def _big_model(src: Path, seed: int, size: int = 3 << 20) -> Path:
    make_model(src, [size], seed=seed)
    return src / "model.safetensors"


KILLER = """
import os, signal, sys
from gpubox.provision import stage as st
from gpubox.provision.stage import sizes
sizes.CHUNK = 128 << 10
n = [0]
real = st.Copier._journal_range
def journal_then_die(self, job, i):
    real(self, job, i)
    n[0] += 1
    if n[0] == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)  # no finally, no cleanup: a kill -9 mid-file
st.Copier._journal_range = journal_then_die
st.stage(sys.argv[1], sys.argv[2], workers=1)
"""


def _kill_mid_range(src: Path, dest: Path, after: int) -> None:
    r = subprocess.run([sys.executable, "-c", KILLER, str(src), str(dest), str(after)], capture_output=True)
    assert r.returncode == -9, r.stderr.decode()[-500:]


def _cold_src(tmp_path: Path, seed: int) -> Path:
    src = tmp_path / "persistent" / "M"
    make_model(src, [4 << 20], seed=seed)
    probe = os.open(src / "config.json", os.O_RDONLY)
    try:
        have = st.cached_bytes(probe, 0, 1 << 20)
    finally:
        os.close(probe)
    if have is None or room.fstype(str(src)) not in st.DIRECT_FS:
        pytest.skip("needs cachestat(2) (Linux 6.5+) and a local block filesystem under tmp_path")
    return src


def _cold_ext4_refusing_o_direct_reads(monkeypatch) -> None:
    """A cold source on a filesystem that opens with O_DIRECT but refuses the read (EINVAL), as
    some FUSE and network filesystems do."""
    real = os.preadv
    monkeypatch.setattr(readers, "cached_bytes", lambda fd, start, n: 0)
    monkeypatch.setattr(copier, "fstype", lambda p: "ext4")

    def preadv(fd, bufs, off, *a):
        if os.O_DIRECT & __import__("fcntl").fcntl(fd, __import__("fcntl").F_GETFL):
            raise OSError(22, "Invalid argument")
        return real(fd, bufs, off, *a)

    monkeypatch.setattr(os, "preadv", preadv)
