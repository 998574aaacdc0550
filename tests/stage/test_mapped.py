"""The mapped writer (readers.map_span): a big file on tmpfs is written through a shared mapping of
its destination, not pwrite (writers of one tmpfs file would queue on the inode lock). Forced here
on whatever filesystem tmp_path is, with a threshold of 0 and 128 KiB ranges."""

import errno
import json
import os
import subprocess
import sys

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import readers, room, sizes
from tests.stage.kit import KILLER, _big_model, _files, _stage


@pytest.fixture
def mapped(monkeypatch, tmp_path):
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    monkeypatch.setattr(readers, "MAP_MIN", 1 << 20)  # the 3 MiB shard mapped, the small files not
    monkeypatch.setattr(readers, "MAP_FS", {room.fstype(str(tmp_path))})


def test_a_big_file_is_written_through_the_mapping_and_matches_the_pwrite_copy(tmp_path, monkeypatch, mapped):
    """No pwrite reaches the big file's partial, the bytes are the source's, and the manifest's
    digests equal those of the pwrite path (the checksum is of the bytes in the mapping)."""
    src = tmp_path / "s"
    shard = _big_model(src, seed=41, size=(3 << 20) + 12345)  # a last, partial page
    real = os.pwrite

    def pwrite(fd, data, off):
        assert not os.readlink(f"/proc/self/fd/{fd}").endswith("model.safetensors" + st.PARTIAL)
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", pwrite)
    _stage(src, tmp_path / "m", workers=4)
    monkeypatch.setattr(readers, "MAP_MIN", None)
    monkeypatch.setattr(os, "pwrite", real)
    _stage(src, tmp_path / "p", workers=4)
    assert (tmp_path / "m" / shard.name).read_bytes() == shard.read_bytes()
    assert _files(tmp_path / "m") == _files(tmp_path / "p")

    def entries(d):
        return {
            r: (e["hash"], e.get("ranges"))
            for r, e in json.loads((d / st.MANIFEST).read_text())["files"].items()
        }

    assert entries(tmp_path / "m") == entries(tmp_path / "p")


def test_a_killed_mapped_copy_resumes_and_ends_identical(tmp_path, mapped):
    """A kill -9 mid-file leaves the partial and its journal; the re-run re-hashes the journaled
    ranges in the partial (written through the mapping) and keeps them."""
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=42)
    force = f"readers.MAP_MIN = 0\nreaders.MAP_FS = {{{room.fstype(str(tmp_path))!r}}}\n"
    killer = KILLER.replace("sizes.CHUNK = 128 << 10\n", "sizes.CHUNK = 128 << 10\n" + force)
    killer = killer.replace("import sizes", "import readers, sizes")
    r = subprocess.run([sys.executable, "-c", killer, str(src), str(dest), "5"], capture_output=True)
    assert r.returncode == -9, r.stderr.decode()[-500:]
    assert (dest / (shard.name + st.PARTIAL)).exists()
    out = _stage(src, dest, workers=2)
    assert out["resumed_bytes"] > 0
    assert (dest / shard.name).read_bytes() == shard.read_bytes()


def test_a_full_destination_at_fallocate_is_one_error_and_no_partial(tmp_path, monkeypatch, mapped):
    src, dest = tmp_path / "s", tmp_path / "d"
    _big_model(src, seed=43)

    def full(fd, off, n):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(st.StageError, match="is full"):
        _stage(src, dest, workers=2)
    assert not list(dest.glob("*" + st.PARTIAL))
