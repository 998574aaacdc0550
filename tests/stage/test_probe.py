"""How a run reads its source (probe.py): too small to probe, the probe of both paths, the setting,
O_DIRECT refused during the probe, threads for a cached source."""

import os

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import copier, probe, readers, sizes
from gpubox.simbox.model import make_model
from tests.pagecache import evict
from tests.stage.kit import _cold_ext4_refusing_o_direct_reads, _cold_src, _files, _stage


def test_a_cold_job_too_small_to_probe_is_read_buffered(tmp_path, monkeypatch):
    """Under 4 x threads uncached ranges there is nothing worth measuring: read as cp does
    (buffered won every measurement: docs/stage.md), no probe, no O_DIRECT."""
    src = tmp_path / "persistent" / "M"
    make_model(src, [3 << 20], seed=13)
    monkeypatch.setattr(readers, "cached_bytes", lambda fd, start, n: 0)
    monkeypatch.setattr(copier, "fstype", lambda p: "ext4")
    monkeypatch.delenv("GPUBOX_STAGE_DIRECT", raising=False)
    out = _stage(src, tmp_path / "d")
    assert out["read"]["mode"] == "buffered" and "probe_gb_s" not in out["read"]
    assert out["read_direct_bytes"] == 0
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()


def test_cold_read_mode_chosen_by_a_probe_of_both(tmp_path, monkeypatch):
    """A cold source: both read paths are timed on uncached ranges at the start of the copy, the
    faster is used (O_DIRECT only by a margin), and the copy is exact either way. The probe's reads
    are the copy's own first bytes of those ranges: no source byte is read twice."""
    monkeypatch.setattr(sizes, "CHUNK", 256 << 10)
    monkeypatch.setattr(probe, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(probe, "COLD_THREADS", 2)
    src = _cold_src(tmp_path, seed=26)
    shard = src / "model.safetensors"
    evict(src)
    read_bytes = [0]
    real = os.preadv

    def preadv(fd, bufs, off, *a):
        n = real(fd, bufs, off, *a)
        if os.path.samestat(os.fstat(fd), shard.stat()):
            read_bytes[0] += n
        return n

    monkeypatch.setattr(os, "preadv", preadv)
    out = _stage(src, tmp_path / "d")
    read = out["read"]
    assert read["mode"] in ("direct", "buffered") and read["threads"] == 2 and read["cold_share"] > 0.5
    rates = read["probe_gb_s"]
    assert set(rates) == {"direct", "buffered"} and min(rates.values()) > 0
    assert (read["mode"] == "direct") == (rates["direct"] > st.DIRECT_MARGIN * rates["buffered"])
    probed_direct = 2 * 2 * probe.PROBE_BYTES  # two O_DIRECT phases of two readers
    if read["mode"] == "direct":
        assert out["read_direct_bytes"] > probed_direct
    else:
        assert out["read_direct_bytes"] == probed_direct
    assert read_bytes[0] == shard.stat().st_size  # every byte read once, the probe's included
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
    assert st.check(str(src), str(tmp_path / "d"), verify=True)["verified"] == len(_files(src))


@pytest.mark.parametrize(("direct_over_buffered", "mode"), [(1.32, "buffered"), (1.6, "direct")])
def test_o_direct_is_taken_only_far_ahead_of_buffered_in_the_probe(
    tmp_path, monkeypatch, direct_over_buffered, mode
):
    """The probe's short reads overstate O_DIRECT against buffered reads: on the 16-core device VM
    it put O_DIRECT 1.32x ahead where whole runs read buffered 1.3x faster. Such a probe keeps
    buffered reads; a probe with O_DIRECT far ahead takes it (and the copy is exact either way)."""
    monkeypatch.setattr(sizes, "CHUNK", 256 << 10)
    monkeypatch.setattr(probe, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(probe, "COLD_THREADS", 2)
    monkeypatch.setattr(
        copier.Copier, "_probe", lambda self, pick, threads: {"direct": direct_over_buffered, "buffered": 1.0}
    )
    src = _cold_src(tmp_path, seed=27)
    evict(src)
    out = _stage(src, tmp_path / "d")
    assert out["read"]["mode"] == mode
    assert (out["read_direct_bytes"] > 0) == (mode == "direct")
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()


def test_the_probe_piece_setting_is_bounded_by_a_range():
    """GPUBOX_STAGE_PROBE_MIB sets the probe's piece per thread (8 MiB unless set), at least 1 MiB
    and at most a 64 MiB range (a piece is a range's first bytes)."""
    import subprocess
    import sys

    def piece(value):
        env = {**os.environ, "GPUBOX_STAGE_PROBE_MIB": value}
        code = "from gpubox.provision.stage import probe; print(probe.PROBE_BYTES >> 20)"
        return int(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )

    assert [piece(v) for v in ("", "32", "999", "0")] == [8, 32, 64, 1]


def test_probe_asks_for_its_buffered_pieces_whole_and_the_copy_leaves_readahead_to_the_kernel(
    tmp_path, monkeypatch
):
    """An 8 MiB piece read from a fresh fd times the readahead's ramp, not the disk (on the device
    VM 0.51 GB/s against 1.23 O_DIRECT): the probe's buffered pieces are asked of the kernel whole
    (POSIX_FADV_WILLNEED), and the copy itself asks nothing more than its readahead (measured faster
    without: benchmarks/results/stage.md, run K)."""
    monkeypatch.setattr(sizes, "CHUNK", 256 << 10)
    monkeypatch.setattr(probe, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(probe, "COLD_THREADS", 2)
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", "")  # probe, whatever an earlier run kept
    src = _cold_src(tmp_path, seed=28)
    evict(src)
    asked = []
    real = os.posix_fadvise

    def fadvise(fd, off, n, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append((off, n))
        return real(fd, off, n, advice)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    out = _stage(src, tmp_path / "d")
    assert "probe_gb_s" in out["read"]
    assert len(asked) == 2 * 2  # two buffered phases of two readers, nothing from the copy
    assert all(n == probe.PROBE_BYTES and off % sizes.CHUNK == 0 for off, n in asked)
    assert st.check(str(src), str(tmp_path / "d"), verify=True)["verified"] == len(_files(src))


@pytest.mark.parametrize("setting,mode", [("0", "buffered"), ("1", "direct")])
def test_cold_read_mode_can_be_set(tmp_path, monkeypatch, setting, mode):
    monkeypatch.setenv("GPUBOX_STAGE_DIRECT", setting)
    src = _cold_src(tmp_path, seed=27)
    evict(src)
    out = _stage(src, tmp_path / "d")
    assert out["read"]["mode"] == mode and "probe_gb_s" not in out["read"]
    assert (out["read_direct_bytes"] > 0) == (mode == "direct")
    assert st.check(str(src), str(tmp_path / "d"), verify=True)["verified"] == len(_files(src))


def test_probe_with_o_direct_refused_at_read_time_copies_buffered(tmp_path, monkeypatch):
    """The probe's O_DIRECT pieces fail (EINVAL at the read): they keep no head, the mode is
    buffered, and the ranges they touched are copied whole: the copy is exact."""
    monkeypatch.setattr(sizes, "CHUNK", 256 << 10)
    monkeypatch.setattr(probe, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(probe, "COLD_THREADS", 2)
    src = tmp_path / "persistent" / "M"
    make_model(src, [4 << 20], seed=28)
    _cold_ext4_refusing_o_direct_reads(monkeypatch)
    out = _stage(src, tmp_path / "d")
    assert out["read"]["mode"] == "buffered" and out["read"]["probe_gb_s"]["direct"] == 0
    assert out["read_direct_bytes"] == 0
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
    assert st.check(str(src), str(tmp_path / "d"), verify=True)["verified"] == len(_files(src))


def test_cached_source_gets_few_writers_per_file(tmp_path):
    """A source in the page cache: WRITERS_PER_FILE (1.5) threads per file of more than one range
    (a second writer of one tmpfs file spins on its inode lock), at most `workers`; exact copy."""
    src = tmp_path / "s"
    make_model(src, [3 << 20, 3 << 20, 3 << 20], seed=31)
    for p in src.iterdir():
        p.read_bytes()
    chunk = sizes.CHUNK
    try:
        sizes.CHUNK = 1 << 20
        out = _stage(src, tmp_path / "d", workers=8)
        few = _stage(src, tmp_path / "d2", workers=2)
    finally:
        sizes.CHUNK = chunk
    if out["read"]["mode"] != "cached":
        pytest.skip("the page cache did not keep the source here")
    assert out["read"]["threads"] == 5 and few["read"]["threads"] == 2  # ceil(1.5 x 3), at most 2
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
