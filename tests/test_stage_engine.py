"""The copy engine (provision.stage) and the integrity check on real files in tmp dirs."""

import hashlib
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import xxhash

from gpubox.provision import safetensors_check as stc
from gpubox.provision import stage as st
from gpubox.simbox.model import make_model
from tests.pagecache import evict

SHARDS = [300_000, 200_000, 120_000]


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path, monkeypatch):
    """The cold probe's verdicts go to this test's own state directory, never the user's."""
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def model(tmp_path):
    src = tmp_path / "persistent" / "M"
    make_model(src, SHARDS, seed=7)
    return src


def _stage(src, dest, **kw):
    kw.setdefault("workers", 2)
    return st.stage(str(src), str(dest), **kw)


def _files(d: Path):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def test_stage_copies_everything_and_writes_manifest_last(model, tmp_path):
    dest = tmp_path / "shm" / "M"
    out = _stage(model, dest)
    assert out["copied"] == len(_files(model)) and out["skipped"] == 0
    assert out["copied_bytes"] == sum(p.stat().st_size for p in model.iterdir())
    for rel in _files(model):
        assert (dest / rel).read_bytes() == (model / rel).read_bytes()
        assert (dest / rel).stat().st_mtime_ns == (model / rel).stat().st_mtime_ns
    man = json.loads((dest / st.MANIFEST).read_text())
    assert set(man["files"]) == set(_files(model))
    assert man["source"]["fingerprint"] == st.fingerprint(st.scan(str(model)))
    assert not (dest / st.JOURNAL).exists()
    assert not list(dest.rglob("*.partial"))
    assert st.check(str(model), str(dest))["staged"] is True


@pytest.mark.parametrize("name", [None, "xxh3", "crc32", "sha256"])
def test_tree_hash_is_sha256_over_chunk_hashes(tmp_path, monkeypatch, name):
    """xxh3 (the default): XXH3-64 per chunk, 8 bytes big-endian; crc32: 4 big-endian bytes; sha256: the
    chunk digests; file = sha256 of them. The per-range digests are in the manifest too."""
    monkeypatch.setattr(st, "CHUNK", 64 << 10)  # several chunks in a small file
    src = tmp_path / "s"
    make_model(src, [400_000], seed=3)
    dest = tmp_path / "d"
    out = _stage(src, dest, hash=name)
    algo = {None: st.HASH_ALGO, **{k: v for k, v in st.HASHES.items()}}[name]
    man = json.loads((dest / st.MANIFEST).read_text())
    assert out["hash"] == man["hash"] == algo
    data = (src / "model.safetensors").read_bytes()
    parts = [data[i : i + st.CHUNK] for i in range(0, len(data), st.CHUNK)]
    if algo.startswith("xxh3"):
        chunks = [xxhash.xxh3_64(p).intdigest().to_bytes(8, "big") for p in parts]
    elif algo.startswith("crc32"):
        chunks = [zlib.crc32(p).to_bytes(4, "big") for p in parts]
    else:
        chunks = [hashlib.sha256(p).digest() for p in parts]
    assert len(chunks) > 5
    entry = man["files"]["model.safetensors"]
    assert entry["algo"] == algo and entry["hash"] == hashlib.sha256(b"".join(chunks)).hexdigest()
    assert {e["algo"] for e in man["files"].values()} == {algo}
    assert entry["ranges"] == [c.hex() for c in chunks]


def test_second_run_copies_nothing(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    before = {r: (dest / r).stat().st_ino for r in _files(dest)}
    out = _stage(model, dest)
    assert out["copied"] == 0 and out["skipped"] == len(_files(model)) and out["reasons"] == {}
    assert {r: (dest / r).stat().st_ino for r in _files(dest)} == before


def test_manifest_absent_means_not_staged(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    (dest / st.MANIFEST).unlink()
    c = st.check(str(model), str(dest))
    assert c["staged"] is False and c["problems"][0] == "manifest absent: not staged"
    out = _stage(model, dest)  # without manifest or journal nothing is trusted
    assert out["copied"] == len(_files(model))
    assert st.check(str(model), str(dest))["staged"]


def test_truncated_staged_shard_found_and_repaired(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    shard = dest / "model-00002-of-00003.safetensors"
    os.truncate(shard, shard.stat().st_size - 1000)
    c = st.check(str(model), str(dest))
    assert not c["staged"]
    assert any("truncated" in p for p in c["problems"])
    out = _stage(model, dest)
    assert out["copied"] == 1 and list(out["reasons"]) == [shard.name]
    assert shard.read_bytes() == (model / shard.name).read_bytes()


def test_truncated_source_shard_refused_before_copying(model, tmp_path):
    shard = model / "model-00001-of-00003.safetensors"
    os.truncate(shard, shard.stat().st_size - 10)
    dest = tmp_path / "d"
    with pytest.raises(
        st.StageError, match="not a complete model: model-00001-of-00003.safetensors: truncated"
    ):
        _stage(model, dest)
    assert not dest.exists()


def test_missing_shard_named_in_index(model, tmp_path):
    (model / "model-00003-of-00003.safetensors").unlink()
    assert stc.check_model(str(model)) == [
        "shard model-00003-of-00003.safetensors named in model.safetensors.index.json is missing"
    ]
    with pytest.raises(st.StageError, match="model-00003-of-00003.safetensors named in"):
        _stage(model, tmp_path / "d")


def test_missing_staged_shard_is_recopied(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    (dest / "model-00003-of-00003.safetensors").unlink()
    c = st.check(str(model), str(dest))
    assert "model-00003-of-00003.safetensors: missing in the destination" in c["problems"]
    assert _stage(model, dest)["copied"] == 1


def test_corrupted_byte_found_only_by_verify(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    shard = dest / "model-00001-of-00003.safetensors"
    st0 = shard.stat()
    with open(shard, "r+b") as f:  # flip one tensor byte, keep size and mtime
        f.seek(st0.st_size - 5)
        b = f.read(1)
        f.seek(st0.st_size - 5)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(shard, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    assert st.check(str(model), str(dest))["staged"] is True  # stat and headers cannot see it
    v = st.check(str(model), str(dest), verify=True)
    assert v["staged"] is False and v["mismatched"] == [shard.name]
    assert v["verified"] == len(_files(model)) - 1
    out = _stage(model, dest, verify=True)
    assert out["copied"] == 1 and "hash mismatch" in out["reasons"][shard.name]
    assert st.check(str(model), str(dest), verify=True)["staged"]


class Interrupt(Exception):
    pass


def test_interrupted_copy_resumes(model, tmp_path):
    dest = tmp_path / "d"
    landed = []

    def boom(rel):
        landed.append(rel)
        if len(landed) == 2:
            raise Interrupt("simulated kill after 2 files")

    with pytest.raises(Interrupt):
        _stage(model, dest, on_file=boom, workers=1)
    assert not (dest / st.MANIFEST).exists()  # never looks complete
    journal = [json.loads(x) for x in (dest / st.JOURNAL).read_text().splitlines()]
    assert [e["rel"] for e in journal] == landed
    (dest / "model-00003-of-00003.safetensors.partial").write_bytes(b"half a file")
    c = st.check(str(model), str(dest))
    # a worker may land one more queued file before the cancel reaches it; all landed are journaled
    n = len(landed)
    assert 2 <= n < len(_files(model))
    assert (
        c["problems"][0]
        == f"manifest absent: staging was interrupted ({n} of {len(_files(model))} files done)"
    )
    out = _stage(model, dest)
    assert out["copied"] == len(_files(model)) - n and out["skipped"] == n
    assert set(out["reasons"]).isdisjoint(landed)
    assert not list(dest.rglob("*.partial")) and st.check(str(model), str(dest))["staged"]


def test_second_stager_refused(model, tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from gpubox.provision.stage import Lock\n"
            f"with Lock({str(dest)!r}):\n print('held', flush=True); sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(st.StageError, match=rf"another stager \(pid {holder.pid}\) is staging into"):
            _stage(model, dest)
    finally:
        holder.communicate("go\n", timeout=10)
    assert _stage(model, dest)["copied"] == len(_files(model))  # free again once it is gone


def test_too_small_refused_with_figures(model, tmp_path):
    dest = tmp_path / "d"
    with pytest.raises(st.StageError) as ei:
        _stage(model, dest, free_space=lambda p: 2 << 30, margin=(2 << 30) - 100_000)
    assert "needs 0.6 MB but its filesystem has 2.1 GB free (keeping a 2.1 GB margin)" in ei.value.problem
    assert "--force" in ei.value.fix
    assert not dest.exists()  # nothing half-written
    out = _stage(model, dest, free_space=lambda p: 2 << 30, margin=(2 << 30) - 100_000, force=True)
    assert out["copied"] == len(_files(model))


def test_container_memory_limit_refused_with_figures(model, tmp_path):
    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "memory.max").write_text(f"{64 << 30}\n")
    (cg / "memory.current").write_text(f"{62 << 30}\n")
    with pytest.raises(
        st.StageError,
        match=r"limit 68.7 GB, 66.6 GB in use, 2.1 GB left; staging 0.6 MB "
        r"would leave 2.1 GB \(< 4.3 GB margin\)",
    ):
        _stage(model, tmp_path / "d", tmpfs=True, cgroup_dir=str(cg))
    # not tmpfs: the memory cgroup does not pay for the pages
    assert _stage(model, tmp_path / "d", tmpfs=False, cgroup_dir=str(cg))["copied"] > 0
    (cg / "memory.max").write_text("max\n")
    assert _stage(model, tmp_path / "d2", tmpfs=True, cgroup_dir=str(cg))["room"].get("mem_limit") is None


def test_changed_source_detected_and_only_that_file_recopied(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    cfg = model / "config.json"
    cfg.write_text(cfg.read_text().replace('"hidden_size": 1024', '"hidden_size": 1025'))
    c = st.check(str(model), str(dest))
    assert c["source_changed"] and "the source changed since it was staged" in c["problems"]
    assert "config.json: changed in the source" in c["problems"]
    out = _stage(model, dest)
    assert out["source_changed"] and out["copied"] == 1
    assert (dest / "config.json").read_text() == cfg.read_text()
    (model / "generation_config.json").unlink()
    out = _stage(model, dest)
    assert out["removed"] == ["generation_config.json"] and not (dest / "generation_config.json").exists()


def test_dry_run_changes_nothing(model, tmp_path):
    dest = tmp_path / "d"
    out = _stage(model, dest, dry_run=True)
    assert out["would_copy"] == _files(model) and out["would_copy_bytes"] == out["bytes"]
    assert not dest.exists()


def test_hf_cache_sha256_checked(tmp_path):
    """A hub cache layout: snapshots/<rev>/<name> -> ../../blobs/<sha256> for LFS files."""
    plain = tmp_path / "plain"
    make_model(plain, [100_000, 80_000], seed=5)
    repo = tmp_path / "hub" / "models--org--M"
    snap = repo / "snapshots" / ("a" * 40)
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for p in plain.iterdir():
        data = p.read_bytes()
        blob = (
            hashlib.sha256(data).hexdigest() if p.suffix == ".safetensors" else hashlib.sha1(data).hexdigest()
        )
        (repo / "blobs" / blob).write_bytes(data)
        (snap / p.name).symlink_to(f"../../blobs/{blob}")
    dest = tmp_path / "d"
    _stage(snap, dest)
    man = json.loads((dest / st.MANIFEST).read_text())
    shard = "model-00001-of-00002.safetensors"
    assert man["files"][shard]["sha256"] == hashlib.sha256((plain / shard).read_bytes()).hexdigest()
    assert "sha256" not in man["files"]["config.json"]  # git sha1 blobs are not content sha256
    # a blob whose content no longer matches its name is refused
    target = (snap / shard).resolve()
    with open(target, "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(st.StageError, match="differs from the hub's"):
        _stage(snap, tmp_path / "d2")
    assert not (tmp_path / "d2" / st.MANIFEST).exists()


def test_payload_runs_with_stdlib_only(model, tmp_path):
    """What travels into a container without gpubox: the copier's payload (gpubox.transport.payload)
    with `--request JSON`, run in isolated mode without site-packages (no xxhash: crc32)."""
    from gpubox.transport import payload
    from gpubox.transport.local import LocalTransport

    dest = tmp_path / "d"
    req = {"op": "stage", "src": str(model), "dest": str(dest), "workers": 2}

    def run(r):
        return payload.run(
            LocalTransport(),
            "gpubox.provision.stage",
            ["--request", json.dumps(r)],
            python=sys.executable,
            flags=["-I", "-S"],
        )

    r = run(req)
    assert r.rc == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["copied"] == len(_files(model))
    man = json.loads((dest / st.MANIFEST).read_text())
    assert {e["algo"] for e in man["files"].values()} == {st.HASHES["crc32"]}
    r = run({**req, "op": "check"})
    assert r.rc == 0 and json.loads(r.stdout)["staged"] is True
    r = run({**req, "src": str(tmp_path / "nope")})
    assert r.rc == 2 and "is not a directory" in json.loads(r.stdout)["error"]


def test_written_shards_are_real_safetensors(model):
    from safetensors import safe_open

    idx = json.loads((model / "model.safetensors.index.json").read_text())
    for shard in sorted(set(idx["weight_map"].values())):
        with safe_open(str(model / shard), framework="numpy") as f:
            for name in f.keys():
                assert idx["weight_map"][name] == shard
                n_hdr, hdr = stc.read_header(str(model / shard))
                assert f.get_slice(name).get_shape() == hdr[name]["shape"]


def test_header_checks(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x05\x00")
    assert "too short" in stc.check_shard(str(p))[0][0]
    p.write_bytes((10).to_bytes(8, "little") + b"{not json}")
    assert "not JSON" in stc.check_shard(str(p))[0][0]
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}).encode()
    p.write_bytes(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 12)
    assert "needs 16 bytes, offsets give 12" in stc.check_shard(str(p))[0][0]
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    p.write_bytes(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 20)
    assert "has trailing bytes" in stc.check_shard(str(p))[0][0]


# -- the hash choice (xxh3 default, crc32 without xxhash, sha256 on request) --------------------
def _flip_byte(path: Path, back: int = 5) -> None:
    """Flip one tensor byte near the end, keeping size and mtime (what stat cannot see)."""
    s0 = path.stat()
    with open(path, "r+b") as f:
        f.seek(s0.st_size - back)
        b = f.read(1)
        f.seek(s0.st_size - back)
        f.write(bytes([b[0] ^ 0x01]))
    os.utime(path, ns=(s0.st_atime_ns, s0.st_mtime_ns))


def test_default_hash_is_xxh3_and_finds_a_flipped_bit_with_verify(model, tmp_path):
    dest = tmp_path / "d"
    out = _stage(model, dest)
    assert st.DEFAULT_HASH == "xxh3" and out["hash"] == "xxh3-tree-64MiB"  # xxhash is a dependency
    shard = dest / "model-00002-of-00003.safetensors"
    _flip_byte(shard)
    assert st.check(str(model), str(dest))["staged"] is True
    v = st.check(str(model), str(dest), verify=True)
    assert v["staged"] is False and v["mismatched"] == [shard.name] and v["hashes"] == ["xxh3-tree-64MiB"]
    out = _stage(model, dest, verify=True)
    assert out["copied"] == 1 and out["reasons"] == {
        shard.name: "hash mismatch (corrupted in the destination)"
    }
    assert shard.read_bytes() == (model / shard.name).read_bytes()


def test_sha256_staged_dir_stays_staged_and_verifies_under_the_default(model, tmp_path):
    dest = tmp_path / "d"
    assert _stage(model, dest, hash="sha256")["hash"] == "sha256-tree-64MiB"
    n = len(_files(model))
    c = st.check(str(model), str(dest), verify=True)
    assert c["staged"] and c["verified"] == n and c["hashes"] == ["sha256-tree-64MiB"]
    out = _stage(model, dest)  # the default (xxh3) requested: nothing to re-copy
    assert out["copied"] == 0 and out["skipped"] == n
    out = _stage(model, dest, verify=True)  # verified with the manifest's own sha256
    assert out["copied"] == 0 and out["verified"] == n
    _flip_byte(dest / "model-00001-of-00003.safetensors")
    v = st.check(str(model), str(dest), verify=True)
    assert v["mismatched"] == ["model-00001-of-00003.safetensors"] and v["verified"] == n - 1
    # the repair copies that one file with the requested default; the others keep their sha256
    out = _stage(model, dest, verify=True)
    assert out["copied"] == 1 and out["hash"] == "xxh3-tree-64MiB"
    man = json.loads((dest / st.MANIFEST).read_text())
    algos = {r: e["algo"] for r, e in man["files"].items()}
    assert algos.pop("model-00001-of-00003.safetensors") == "xxh3-tree-64MiB"
    assert set(algos.values()) == {"sha256-tree-64MiB"}
    c = st.check(str(model), str(dest), verify=True)
    assert c["staged"] and c["verified"] == n and c["hashes"] == ["sha256-tree-64MiB", "xxh3-tree-64MiB"]


def test_manifest_from_before_the_hash_choice_still_verifies(model, tmp_path):
    """Older manifests: "hash": "sha256-tree-64MiB" at the top, no per-file "algo"."""
    dest = tmp_path / "d"
    _stage(model, dest, hash="sha256")
    mpath = dest / st.MANIFEST
    man = json.loads(mpath.read_text())
    for e in man["files"].values():
        del e["algo"]
    mpath.write_text(json.dumps(man))
    c = st.check(str(model), str(dest), verify=True)
    assert c["staged"] and c["verified"] == len(_files(model))
    man["hash"] = "md5-tree-64MiB"  # an algorithm this copier does not know
    mpath.write_text(json.dumps(man))
    c = st.check(str(model), str(dest), verify=True)
    assert (
        not c["staged"]
        and "config.json: staged with hash 'md5-tree-64MiB', which this copier cannot compute here"
        in c["problems"]
    )


def test_unknown_hash_is_refused(model, tmp_path):
    with pytest.raises(st.StageError, match="unknown hash 'md5'") as ei:
        _stage(model, tmp_path / "d", hash="md5")
    assert "xxh3, crc32, sha256" in ei.value.fix
    assert not (tmp_path / "d").exists()


def test_empty_file_staged_and_verified(model, tmp_path):
    (model / "empty.txt").write_bytes(b"")
    dest = tmp_path / "d"
    _stage(model, dest)
    assert (dest / "empty.txt").read_bytes() == b""
    assert st.check(str(model), str(dest), verify=True)["verified"] == len(_files(model))


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
    if have is None or st._fstype(str(src)) not in st.DIRECT_FS:
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


def _cold_ext4_refusing_o_direct_reads(monkeypatch) -> None:
    """A cold source on a filesystem that opens with O_DIRECT but refuses the read (EINVAL), as
    some FUSE and network filesystems do."""
    real = os.preadv
    monkeypatch.setattr(st, "cached_bytes", lambda fd, start, n: 0)
    monkeypatch.setattr(st, "_fstype", lambda p: "ext4")

    def preadv(fd, bufs, off, *a):
        if os.O_DIRECT & __import__("fcntl").fcntl(fd, __import__("fcntl").F_GETFL):
            raise OSError(22, "Invalid argument")
        return real(fd, bufs, off, *a)

    monkeypatch.setattr(st.os, "preadv", preadv)


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


def test_a_cold_job_too_small_to_probe_is_read_buffered(tmp_path, monkeypatch):
    """Under 4 x threads uncached ranges there is nothing worth measuring: read as cp does
    (buffered won every measurement: docs/stage.md), no probe, no O_DIRECT."""
    src = tmp_path / "persistent" / "M"
    make_model(src, [3 << 20], seed=13)
    monkeypatch.setattr(st, "cached_bytes", lambda fd, start, n: 0)
    monkeypatch.setattr(st, "_fstype", lambda p: "ext4")
    monkeypatch.delenv("GPUBOX_STAGE_DIRECT", raising=False)
    out = _stage(src, tmp_path / "d")
    assert out["read"]["mode"] == "buffered" and "probe_gb_s" not in out["read"]
    assert out["read_direct_bytes"] == 0
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()


# -- ranges: one file split across workers, resumed after a kill, damage located ---------------
def _big_model(src: Path, seed: int, size: int = 3 << 20) -> Path:
    make_model(src, [size], seed=seed)
    return src / "model.safetensors"


def test_one_large_file_is_split_across_workers_into_one_partial(tmp_path, monkeypatch):
    """With more workers than files, the ranges of one shard go to several workers, each pwrite()ing
    into the same NAME.partial: the copy is exact and its range digests are the source's."""
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src = tmp_path / "s"
    shard = _big_model(src, seed=21)
    writers: dict[int, set] = {}
    real = st._chunk

    def spy(sfd, dfd, start, end, *a, **kw):
        if dfd is not None and end - start == st.CHUNK:
            writers.setdefault(os.fstat(dfd).st_ino, set()).add(__import__("threading").get_ident())
        return real(sfd, dfd, start, end, *a, **kw)

    monkeypatch.setattr(st, "_chunk", spy)
    out = _stage(src, tmp_path / "d", workers=4)
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
    assert max(len(t) for t in writers.values()) > 1  # several threads wrote the one shard
    entry = json.loads((tmp_path / "d" / st.MANIFEST).read_text())["files"][shard.name]
    data = shard.read_bytes()
    assert entry["ranges"] == [
        xxhash.xxh3_64(data[i : i + st.CHUNK]).digest().hex() for i in range(0, len(data), st.CHUNK)
    ]
    assert out["copied_bytes"] == sum(p.stat().st_size for p in src.iterdir())


def _takes(jobs: list, workers: int) -> list[list[tuple[str, int | None]]]:
    """Each worker's ranges, in the order _Schedule hands them out when workers take in turn."""
    sched, spans = st._Schedule(jobs), [None] * workers
    got: list[list] = [[] for _ in range(workers)]
    live = set(range(workers))
    while live:
        for w in sorted(live):
            t = sched.take(spans[w])
            if t is None:
                live.discard(w)
                continue
            spans[w], i = t
            got[w].append((spans[w].job.rel, i))
    return got


@pytest.mark.parametrize("workers", [1, 3, 5, 8, 13])
def test_schedule_hands_each_range_once_in_contiguous_spans(tmp_path, workers):
    """Every range is copied once; a worker reads one contiguous stretch of a file at a time (its
    readahead carries over), and with more workers than files the big shard is split among them,
    while a whole-file (hub sha256) job stays with one worker."""
    sizes = {"a": 17, "b": 5, "c": 1, "hub": 4}
    jobs = [
        st._FileJob(
            str(tmp_path), str(tmp_path), r, {"size": n * st.CHUNK, "hub_sha256": "x" if r == "hub" else ""}
        )
        for r, n in sizes.items()
    ]
    got = _takes(jobs, workers)
    handed = sorted((r, i) for w in got for r, i in w if i is not None)
    assert handed == sorted((r, i) for r, n in sizes.items() if r != "hub" for i in range(n))
    assert sum(1 for w in got for r, i in w if r == "hub") == 1
    # a stretch goes on while a worker's next range is the one after its last in the same file;
    # each worker starts at most one beyond the files' own (by stealing), where ranges handed out
    # in turn would start one per range (23 of them)
    stretches = sum(
        1 for w in got for k, (r, i) in enumerate(w) if k == 0 or i is None or w[k - 1] != (r, i - 1)
    )
    assert stretches <= len(sizes) + workers
    if workers >= 5:
        assert len({id(w) for w in got if any(r == "a" for r, _ in w)}) > 1


def test_a_worker_reads_its_stretch_of_a_file_through_one_fd(tmp_path, monkeypatch):
    """The readahead state lives in the open file: one reader fd per worker and file, not one per
    64 MiB range (the engine opened a new one per range, and a cold stream's readahead restarted)."""
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src = tmp_path / "s"
    shard = _big_model(src, seed=23)
    opens = []
    real = os.open

    def spy(path, *a, **kw):
        if str(path) == str(shard):
            opens.append(path)
        return real(path, *a, **kw)

    monkeypatch.setattr(st.os, "open", spy)
    _stage(src, tmp_path / "d", workers=1)
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
    assert shard.stat().st_size // st.CHUNK >= 20
    assert len(opens) <= 4  # the witness fd, the reader's, and the integrity checks' reads


def test_writers_of_one_file_take_turns(tmp_path, monkeypatch):
    """Several workers on one shard never pwrite into it at the same time: a second writer waits
    on the file's lock (asleep) instead of spinning on tmpfs's inode lock."""
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    monkeypatch.setattr(st, "BUF", 32 << 10)
    src = tmp_path / "s"
    shard = _big_model(src, seed=24)
    inside: dict[int, int] = {}
    most = [0]
    guard = __import__("threading").Lock()
    real = st._write

    def write(dfd, view, off):
        ino = os.fstat(dfd).st_ino
        with guard:
            inside[ino] = inside.get(ino, 0) + 1
            most[0] = max(most[0], inside[ino])
        try:
            __import__("time").sleep(0.0005)  # a write long enough for another writer to arrive
            return real(dfd, view, off)
        finally:
            with guard:
                inside[ino] -= 1

    monkeypatch.setattr(st, "_write", write)
    _stage(src, tmp_path / "d", workers=4)
    assert (tmp_path / "d" / shard.name).read_bytes() == shard.read_bytes()
    assert most[0] == 1


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_source_file_replaced_or_removed_mid_copy_is_an_error(tmp_path, monkeypatch, how):
    """A worker reads its stretch of a file through the fd it opened, so a file renamed over (a
    re-download) or removed after that would be copied whole from the old inode: the name is
    checked at the end of the file, exit 2, and no partial is left."""
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=25)
    real = st.Copier._journal_range

    def journal_then_swap(self, job, i):
        real(self, job, i)
        if i == 0:
            if how == "replaced":
                new = shard.with_name("new.tmp")
                new.write_bytes(shard.read_bytes())
                os.utime(new, ns=(job.info["mtime_ns"], job.info["mtime_ns"]))  # same size and mtime
                os.replace(new, shard)
            else:
                shard.unlink()

    monkeypatch.setattr(st.Copier, "_journal_range", journal_then_swap)
    with pytest.raises(st.StageError, match=f"{shard.name} was removed or replaced during the copy"):
        _stage(src, dest, workers=1)
    assert not list(dest.glob("*" + st.PARTIAL)) and not (dest / st.MANIFEST).exists()


KILLER = """
import os, signal, sys
from gpubox.provision import stage as st
st.CHUNK = 128 << 10
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


def test_resume_after_a_kill_mid_file_keeps_the_journaled_ranges(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=22)
    _kill_mid_range(src, dest, after=5)
    partial = Path(st.temp_path(str(dest / shard.name)))
    assert partial.exists() and not (dest / st.MANIFEST).exists()
    recs = [json.loads(x) for x in (dest / st.JOURNAL).read_text().splitlines()]
    assert len([r for r in recs if "range" in r]) == 5
    c = st.check(str(src), str(dest))
    assert not c["staged"] and c["problems"][0].startswith("manifest absent")
    # one kept range damaged after the kill: it is found by its digest and copied again
    with open(partial, "r+b") as f:
        f.seek(st.CHUNK + 10)
        b = f.read(1)
        f.seek(st.CHUNK + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    out = _stage(src, dest)
    assert out["resumed_bytes"] == 4 * st.CHUNK
    assert (dest / shard.name).read_bytes() == shard.read_bytes()
    assert not partial.exists() and not (dest / st.JOURNAL).exists()
    assert st.check(str(src), str(dest), verify=True)["verified"] == len(_files(src))


def test_partial_of_a_changed_source_is_not_resumed(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=23)
    _kill_mid_range(src, dest, after=3)
    data = bytearray(shard.read_bytes())
    data[-100] ^= 1
    shard.write_bytes(bytes(data))  # new mtime: the journaled ranges are of an older file
    out = _stage(src, dest)
    assert out["resumed_bytes"] == 0
    assert (dest / shard.name).read_bytes() == bytes(data)
    assert not list(dest.rglob("*" + st.PARTIAL))


def test_resumed_partial_counts_as_room_already_taken(tmp_path, monkeypatch):
    """The space check asks only for what the kept partial does not hold yet."""
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    _big_model(src, seed=24)
    _kill_mid_range(src, dest, after=8)
    total = sum(p.stat().st_size for p in src.iterdir())
    free = total - 8 * st.CHUNK + (64 << 10)  # too little for everything, enough for the rest
    out = _stage(src, dest, tmpfs=True, free_space=lambda d: free, margin=0)
    assert out["resumed_bytes"] == 8 * st.CHUNK and out["room"]["need"] <= total - 8 * st.CHUNK
    with pytest.raises(st.StageError, match="needs"):
        _stage(src, tmp_path / "fresh", tmpfs=True, free_space=lambda d: free, margin=0)


def test_verify_names_the_damaged_range(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=25)
    _stage(src, dest)
    _flip_byte(dest / shard.name, back=st.CHUNK * 3)
    size = shard.stat().st_size
    i = (size - st.CHUNK * 3) // st.CHUNK
    v = st.stage(str(src), str(dest), verify=True, dry_run=True)
    want = f"hash mismatch (corrupted in the destination): bytes {i * st.CHUNK}-{(i + 1) * st.CHUNK - 1}"
    assert v["reasons"] == {shard.name: want}


def test_without_xxhash_the_default_is_crc32_and_xxh3_entries_are_recopied(model, tmp_path, monkeypatch):
    """The standalone copier may run where only the stdlib is: crc32 then, and a directory staged
    with xxh3 stays staged for the cheap check but cannot be re-hashed there (so --verify re-copies)."""
    dest = tmp_path / "d"
    _stage(model, dest)  # xxh3
    code = (
        "import sys; sys.modules['xxhash'] = None\n"
        "from gpubox.provision import stage as st\n"
        "print(st.DEFAULT_HASH, st.HASH_ALGO)\n"
        "try:\n st.algorithm('xxh3')\nexcept st.StageError as e:\n print(e.problem, '|', e.fix)\n"
        f"print(st.check({str(model)!r}, {str(dest)!r})['staged'])\n"
        f"print(st.check({str(model)!r}, {str(dest)!r}, verify=True)['problems'][0])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    assert lines[0] == "crc32 crc32-tree-64MiB", r.stderr
    assert "needs the Python package xxhash" in lines[1] and "--hash crc32" in lines[1]
    assert lines[2] == "True"
    assert "staged with hash 'xxh3-tree-64MiB', which this copier cannot compute here" in lines[3]


def _cold_src(tmp_path: Path, seed: int) -> Path:
    src = tmp_path / "persistent" / "M"
    make_model(src, [4 << 20], seed=seed)
    probe = os.open(src / "config.json", os.O_RDONLY)
    try:
        have = st.cached_bytes(probe, 0, 1 << 20)
    finally:
        os.close(probe)
    if have is None or st._fstype(str(src)) not in st.DIRECT_FS:
        pytest.skip("needs cachestat(2) (Linux 6.5+) and a local block filesystem under tmp_path")
    return src


def test_cold_read_mode_chosen_by_a_probe_of_both(tmp_path, monkeypatch):
    """A cold source: both read paths are timed on uncached ranges at the start of the copy, the
    faster is used (O_DIRECT only by a margin), and the copy is exact either way. The probe's reads
    are the copy's own first bytes of those ranges: no source byte is read twice."""
    monkeypatch.setattr(st, "CHUNK", 256 << 10)
    monkeypatch.setattr(st, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(st, "COLD_THREADS", 2)
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

    monkeypatch.setattr(st.os, "preadv", preadv)
    out = _stage(src, tmp_path / "d")
    read = out["read"]
    assert read["mode"] in ("direct", "buffered") and read["threads"] == 2 and read["cold_share"] > 0.5
    rates = read["probe_gb_s"]
    assert set(rates) == {"direct", "buffered"} and min(rates.values()) > 0
    assert (read["mode"] == "direct") == (rates["direct"] > st.DIRECT_MARGIN * rates["buffered"])
    probed_direct = 2 * 2 * st.PROBE_BYTES  # two O_DIRECT phases of two readers
    if read["mode"] == "direct":
        assert out["read_direct_bytes"] > probed_direct
    else:
        assert out["read_direct_bytes"] == probed_direct
    assert read_bytes[0] == shard.stat().st_size  # every byte read once, the probe's included
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
    assert st.check(str(src), str(tmp_path / "d"), verify=True)["verified"] == len(_files(src))


def test_probe_asks_for_its_buffered_pieces_whole_and_the_copy_leaves_readahead_to_the_kernel(
    tmp_path, monkeypatch
):
    """An 8 MiB piece read from a fresh fd times the readahead's ramp, not the disk (on the device
    VM 0.51 GB/s against 1.23 O_DIRECT): the probe's buffered pieces are asked of the kernel whole
    (POSIX_FADV_WILLNEED), and the copy itself asks nothing more than its readahead (measured faster
    without: docs/stage.md, run K)."""
    monkeypatch.setattr(st, "CHUNK", 256 << 10)
    monkeypatch.setattr(st, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(st, "COLD_THREADS", 2)
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", "")  # probe, whatever an earlier run kept
    src = _cold_src(tmp_path, seed=28)
    evict(src)
    asked = []
    real = os.posix_fadvise

    def fadvise(fd, off, n, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append((off, n))
        return real(fd, off, n, advice)

    monkeypatch.setattr(st.os, "posix_fadvise", fadvise)
    out = _stage(src, tmp_path / "d")
    assert "probe_gb_s" in out["read"]
    assert len(asked) == 2 * 2  # two buffered phases of two readers, nothing from the copy
    assert all(n == st.PROBE_BYTES and off % st.CHUNK == 0 for off, n in asked)
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


# -- the default checksum against the reference implementation's own known answers -------------
VECTORS = Path(__file__).parent / "fixtures" / "stage" / "realworld" / "xxh3_sanity_vectors.txt"


def _sanity_buffer(n: int) -> bytes:
    """xxHash's self-test input (see the fixture's provenance)."""
    g, out = 2654435761, bytearray(n)
    for i in range(n):
        out[i] = g >> 56
        g = g * 11400714785074694797 % (1 << 64)
    return bytes(out)


def _vectors() -> list[tuple[int, int]]:
    rows = [ln.split() for ln in VECTORS.read_text().splitlines() if ln and not ln.startswith("#")]
    return [(int(n), int(h, 16)) for n, h in rows]


def test_xxh3_range_digest_matches_the_reference_known_answers():
    """The copier's xxh3 checksum, fed in uneven slices as reads deliver them, gives the reference
    XXH3_64bits value of every length class, stored big-endian (XXH3's canonical form)."""
    make = st._CHUNK_HASH["xxh3-tree-64MiB"]
    for n, want in _vectors():
        data = memoryview(_sanity_buffer(n))
        h, off, step = make(), 0, 1
        while off < n:
            h.update(data[off : off + step])
            off, step = off + step, step * 3 + 1
        assert h.digest() == want.to_bytes(8, "big"), n


def test_staged_file_hash_is_sha256_of_the_reference_xxh3(model, tmp_path):
    n, want = _vectors()[-1]
    (model / "sanity.bin").write_bytes(_sanity_buffer(n))
    dest = tmp_path / "d"
    _stage(model, dest)
    entry = json.loads((dest / st.MANIFEST).read_text())["files"]["sanity.bin"]
    assert entry["algo"] == "xxh3-tree-64MiB"
    assert entry["hash"] == hashlib.sha256(want.to_bytes(8, "big")).hexdigest()


def test_unreadable_range_records_are_not_trusted(tmp_path, monkeypatch):
    """Range lines cut or garbled by the kill (bad digest, range out of the file) resume nothing:
    the partial is removed and the file copied whole."""
    monkeypatch.setattr(st, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=28)
    _kill_mid_range(src, dest, after=4)
    lines = (dest / st.JOURNAL).read_text().splitlines()
    bad = []
    for ln in lines:
        e = json.loads(ln)
        if "range" in e:
            e["digest"] = "not hex" if e["range"] % 2 else e["digest"]
            e["range"] = e["range"] if e["range"] % 2 else 10**6
        bad.append(json.dumps(e))
    (dest / st.JOURNAL).write_text("\n".join(bad) + '\n{"rel": "model.safe')
    out = _stage(src, dest)
    assert out["resumed_bytes"] == 0
    assert (dest / shard.name).read_bytes() == shard.read_bytes()
    assert not list(dest.rglob("*" + st.PARTIAL))


def test_probe_with_o_direct_refused_at_read_time_copies_buffered(tmp_path, monkeypatch):
    """The probe's O_DIRECT pieces fail (EINVAL at the read): they keep no head, the mode is
    buffered, and the ranges they touched are copied whole: the copy is exact."""
    monkeypatch.setattr(st, "CHUNK", 256 << 10)
    monkeypatch.setattr(st, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(st, "COLD_THREADS", 2)
    src = tmp_path / "persistent" / "M"
    make_model(src, [4 << 20], seed=28)
    _cold_ext4_refusing_o_direct_reads(monkeypatch)
    out = _stage(src, tmp_path / "d")
    assert out["read"]["mode"] == "buffered" and out["read"]["probe_gb_s"]["direct"] == 0
    assert out["read_direct_bytes"] == 0
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
    assert st.check(str(src), str(tmp_path / "d"), verify=True)["verified"] == len(_files(src))


def test_probe_verdict_is_remembered_per_filesystem_and_expires(tmp_path, monkeypatch):
    """The next cold run on the same filesystem takes the probe's verdict from the state directory
    and probes nothing; an expired verdict (or none kept) means a probe again."""
    monkeypatch.setattr(st, "CHUNK", 256 << 10)
    monkeypatch.setattr(st, "PROBE_BYTES", 64 << 10)
    monkeypatch.setattr(st, "COLD_THREADS", 2)
    src = _cold_src(tmp_path, seed=30)
    probes = []
    real = st.Copier._probe
    monkeypatch.setattr(st.Copier, "_probe", lambda self, *a: probes.append(1) or real(self, *a))
    evict(src)
    first = _stage(src, tmp_path / "d1")["read"]
    assert probes == [1] and "probed_at" not in first
    saved = json.loads((tmp_path / "state" / st.VERDICTS).read_text())
    ((key, entry),) = saved.items()
    assert key == st._fs_key(str(src), 2) and entry["mode"] == first["mode"]
    evict(src)
    second = _stage(src, tmp_path / "d2")
    assert probes == [1]  # not probed again
    assert second["read"]["mode"] == first["mode"] and second["read"]["probed_at"] == entry["at"]
    for rel in _files(src):
        assert (tmp_path / "d2" / rel).read_bytes() == (src / rel).read_bytes()
    entry["at"] -= 8 * 86400  # older than VERDICT_DAYS (7)
    (tmp_path / "state" / st.VERDICTS).write_text(json.dumps({key: entry}))
    evict(src)
    third = _stage(src, tmp_path / "d3")["read"]
    assert probes == [1, 1] and "probed_at" not in third
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", "")  # keep none: every cold run probes
    evict(src)
    _stage(src, tmp_path / "d4")
    evict(src)
    _stage(src, tmp_path / "d5")
    assert probes == [1, 1, 1, 1]


def test_remembering_a_verdict_removes_a_killed_runs_temp(tmp_path, monkeypatch):
    """A run killed between the temp and the rename leaves VERDICTS.<pid>.tmp, a name no later run
    would reuse: the next save removes it (its pid is gone), and keeps a live process's temp."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("GPUBOX_STAGE_STATE_DIR", str(state))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs (reaped)
    left = state / f"{st.VERDICTS}.{dead.pid}.tmp"
    live = state / f"{st.VERDICTS}.{os.getppid()}.tmp"
    other = state / "notes.tmp"
    for p in (left, live, other):
        p.write_text("{")
    st._remember(str(tmp_path), 2, "buffered", {"direct": 1.0, "buffered": 1.2})
    assert not left.exists() and live.exists() and other.exists()
    assert json.loads((state / st.VERDICTS).read_text())[st._fs_key(str(tmp_path), 2)]["mode"] == "buffered"


def test_cached_source_gets_few_writers_per_file(tmp_path):
    """A source in the page cache: WRITERS_PER_FILE (1.5) threads per file of more than one range
    (a second writer of one tmpfs file spins on its inode lock), at most `workers`; exact copy."""
    src = tmp_path / "s"
    make_model(src, [3 << 20, 3 << 20, 3 << 20], seed=31)
    for p in src.iterdir():
        p.read_bytes()
    chunk = st.CHUNK
    try:
        st.CHUNK = 1 << 20
        out = _stage(src, tmp_path / "d", workers=8)
        few = _stage(src, tmp_path / "d2", workers=2)
    finally:
        st.CHUNK = chunk
    if out["read"]["mode"] != "cached":
        pytest.skip("the page cache did not keep the source here")
    assert out["read"]["threads"] == 5 and few["read"]["threads"] == 2  # ceil(1.5 x 3), at most 2
    for rel in _files(src):
        assert (tmp_path / "d" / rel).read_bytes() == (src / rel).read_bytes()
