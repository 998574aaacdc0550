"""Reading the source (readers.py): O_DIRECT for a cold source, buffered for a cached one, O_DIRECT refused
at the read, one fd per worker's stretch."""

import os

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import room, sizes
from gpubox.simbox.model import make_model
from tests.pagecache import evict
from tests.stage.kit import _big_model, _cold_ext4_refusing_o_direct_reads, _files, _stage


def test_cold_source_read_with_o_direct_warm_source_buffered(tmp_path, monkeypatch):
    """After a reboot the source is not cached: its chunks are read with O_DIRECT (no page-cache
    insertion); a cached source is read from the cache. Both copies are exact and verify."""
    src = tmp_path / "persistent" / "M"
    make_model(src, [3 << 20, 2 << 20], seed=11)
    probe = os.open(src / "config.json", os.O_RDONLY)
    try:
        have = st.cached_bytes(probe, 0, 1 << 20)
    finally:
        os.close(probe)
    if have is None or room.fstype(str(src)) not in st.DIRECT_FS:
        pytest.skip("needs cachestat(2) (Linux 6.5+) and a local block filesystem under tmp_path")
    shards = [p for p in src.iterdir() if p.suffix == ".safetensors"]
    evict(src)
    monkeypatch.setenv("GPUBOX_STAGE_DIRECT", "1")  # too small to probe: buffered unless asked
    cold = _stage(src, tmp_path / "cold")
    assert cold["read_direct_bytes"] >= sum(p.stat().st_size for p in shards) - (1 << 20)
    for p in src.iterdir():
        p.read_bytes()  # now cached
    warm = _stage(src, tmp_path / "warm")
    assert warm["read_direct_bytes"] == 0
    for d in ("cold", "warm"):
        for rel in _files(src):
            assert (tmp_path / d / rel).read_bytes() == (src / rel).read_bytes()
        assert st.check(str(src), str(tmp_path / d), verify=True)["verified"] == len(_files(src))


def test_o_direct_refused_at_read_time_falls_back_to_buffered(tmp_path, monkeypatch):
    """A filesystem that opens with O_DIRECT but refuses the read (EINVAL) is read buffered."""
    src = tmp_path / "persistent" / "M"
    make_model(src, [3 << 20], seed=12)
    _cold_ext4_refusing_o_direct_reads(monkeypatch)
    monkeypatch.setenv("GPUBOX_STAGE_DIRECT", "1")  # O_DIRECT asked for, refused at the read
    out = _stage(src, tmp_path / "d")
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
    assert out["copied"] == len(_files(src))


def test_a_worker_reads_its_stretch_of_a_file_through_one_fd(tmp_path, monkeypatch):
    """The readahead state lives in the open file: one reader fd per worker and file, not one per
    64 MiB range (the engine opened a new one per range, and a cold stream's readahead restarted)."""
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    src = tmp_path / "s"
    shard = _big_model(src, seed=23)
    opens = []
    real = os.open

    def spy(path, *a, **kw):
        if str(path) == str(shard):
            opens.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    _stage(src, tmp_path / "d", workers=1)
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
    assert shard.stat().st_size // sizes.CHUNK >= 20
    assert len(opens) <= 4  # the witness fd, the reader's, and the integrity checks' reads
