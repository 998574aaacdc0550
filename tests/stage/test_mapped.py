"""The mapped writer (readers.map_span): a big file on tmpfs is written through a shared mapping of
its destination, not pwrite (writers of one tmpfs file would queue on the inode lock). Forced here
on whatever filesystem tmp_path is, with a threshold of 0 and 128 KiB ranges."""

import errno
import json
import os
import subprocess
import sys
import threading

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import readers, room, sizes
from tests.stage.kit import KILLER, _big_model, _files, _stage


@pytest.fixture
def mapped(monkeypatch, tmp_path):
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    monkeypatch.setattr(readers, "MAP_MIN", 1 << 20)  # the 3 MiB shard mapped, the small files not
    monkeypatch.setattr(readers, "MAP_FS", {room.fstype(str(tmp_path))})
    monkeypatch.setattr(readers, "MAP_AUTO", False)  # forced: whatever the file count


def test_a_big_file_is_written_through_the_mapping_and_matches_the_pwrite_copy(tmp_path, monkeypatch, mapped):
    """With no pwrite writer (GPUBOX_STAGE_MAP_PWRITERS=0) no pwrite reaches the big file's partial,
    the bytes are the source's, and the manifest's digests equal those of the pwrite path (the
    checksum is of the bytes in the mapping)."""
    monkeypatch.setattr(readers, "MAP_PWRITERS", 0)
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


@pytest.mark.parametrize("pwriters", [1, 4])
def test_the_first_writers_of_a_mapped_file_use_pwrite(tmp_path, monkeypatch, mapped, pwriters):
    """GPUBOX_STAGE_MAP_PWRITERS=K: the first K copy threads pwrite their ranges of a mapped file
    (into pages allocated already: no fault), the others write through the mapping. Only those
    threads pwrite into it; with as many as there are workers, every byte goes through pwrite; the
    copy and its digests are those of the mapping-only copy."""
    monkeypatch.setattr(readers, "MAP_PWRITERS", pwriters)
    src = tmp_path / "s"
    shard = _big_model(src, seed=47, size=(3 << 20) + 777)
    real, by_thread = os.pwrite, {}

    def pwrite(fd, data, off):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(shard.name + st.PARTIAL):
            key = threading.get_ident()
            by_thread[key] = by_thread.get(key, 0) + len(data)
        return real(fd, data, off)

    monkeypatch.setattr(os, "pwrite", pwrite)
    _stage(src, tmp_path / "h", workers=4)
    monkeypatch.setattr(os, "pwrite", real)
    monkeypatch.setattr(readers, "MAP_PWRITERS", 0)
    _stage(src, tmp_path / "m", workers=4)
    assert len(by_thread) <= pwriters
    if pwriters >= 4:
        assert sum(by_thread.values()) == shard.stat().st_size
    assert (tmp_path / "h" / shard.name).read_bytes() == shard.read_bytes()
    assert _files(tmp_path / "h") == _files(tmp_path / "m")
    assert (
        json.loads((tmp_path / "h" / st.MANIFEST).read_text())["files"]
        == json.loads((tmp_path / "m" / st.MANIFEST).read_text())["files"]
    )


def test_a_killed_mapped_copy_resumes_and_ends_identical(tmp_path, mapped):
    """A kill -9 mid-file leaves the partial and its journal; the re-run re-hashes the journaled
    ranges in the partial (written through the mapping) and keeps them."""
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=42)
    force = (
        f"readers.MAP_MIN = 0\nreaders.MAP_AUTO = False\n"
        f"readers.MAP_FS = {{{room.fstype(str(tmp_path))!r}}}\n"
    )
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


def test_a_mapped_file_in_the_page_cache_gets_a_writer_per_range(tmp_path, mapped):
    """A cached source gets 1.5 writers per pwrite file (they queue on the inode lock), but a
    mapped file none of that limit: one big file is copied by all the workers (with the pwrite
    limit, the mapped writer ran 2 threads and was no faster than pwrite)."""
    src = tmp_path / "s"
    _big_model(src, seed=43, size=3 << 20)  # 24 ranges of 128 KiB
    mapped_run = _stage(src, tmp_path / "m", workers=8)
    assert mapped_run["read"]["mode"] == "cached" and mapped_run["read"]["threads"] == 8
    readers.MAP_MIN = None  # the pwrite path: one multi-range file -> 2 writers
    plain = _stage(src, tmp_path / "p", workers=8)
    assert plain["read"]["threads"] == 2


def test_auto_maps_where_pwrite_would_leave_workers_idle_or_pages_are_huge():
    """The default (GPUBOX_STAGE_MAP_MIB=auto): one big file, or a few, are mapped; as many big
    shards as a quarter of the workers or more keep pwrite (the files alone keep every worker busy,
    and the mapping's 4 KiB faults cost CPU: 8 shards 6.7 GB/s mapped against 9.1); a tmpfs with
    huge pages always maps (one fault per 2 MiB)."""
    assert readers.map_pays(1, 16, ("rw", "nosuid"))
    assert readers.map_pays(4, 16, ())
    assert not readers.map_pays(8, 16, ("rw",))
    assert not readers.map_pays(0, 16, ())
    assert readers.map_pays(8, 16, ("rw", "size=20g", "huge=within_size"))
    assert readers.map_pays(30, 16, ("huge=always",))
    assert not readers.map_pays(8, 16, ("huge=never",))


def test_the_copier_asks_auto_with_the_destination_mount(tmp_path, monkeypatch):
    """One big shard beside small files is mapped by default; eight big shards are not."""
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    monkeypatch.setattr(readers, "MAP_MIN", 1 << 20)
    monkeypatch.setattr(readers, "MAP_FS", {room.fstype(str(tmp_path))})
    assert readers.MAP_AUTO
    from gpubox.provision.stage import schedule

    seen = []
    real = schedule.map_destination

    def spy(dfd, size):
        seen.append(size)
        return real(dfd, size)

    monkeypatch.setattr(schedule, "map_destination", spy)  # where FileJob.open calls it
    one = _big_model(tmp_path / "one", seed=44, size=3 << 20)
    _stage(tmp_path / "one", tmp_path / "d1", workers=8)
    assert seen == [one.stat().st_size]
    seen.clear()
    many = tmp_path / "many"
    _big_model(many, seed=45, size=3 << 20)
    shard = next(many.glob("*.safetensors"))
    for k in range(7):
        (many / f"extra-{k}.bin").write_bytes(os.urandom(2 << 20))
    _stage(many, tmp_path / "d8", workers=8, force=True)
    assert seen == [], "eight big files keep pwrite with 8 workers"
    assert (tmp_path / "d8" / shard.name).read_bytes() == shard.read_bytes()


def test_a_source_read_from_the_disk_is_written_with_pwrite(tmp_path, monkeypatch, mapped):
    """Cold (most of the source not in the page cache), the disk sets the pace and the mapping's
    faults only cost: no mapping is made, the copy is the same."""
    from gpubox.provision.stage import schedule

    calls = []
    monkeypatch.setattr(schedule, "map_destination", lambda *a: calls.append(a) or None)
    monkeypatch.setattr(readers, "cached_bytes", lambda fd, off, n: 0)  # nothing cached
    shard = _big_model(tmp_path / "s", seed=46)
    out = _stage(tmp_path / "s", tmp_path / "d", workers=4)
    assert out["read"]["mode"] != "cached" and calls == []
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
