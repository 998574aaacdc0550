"""The checksums (hashing.py): the tree digest, the hash choice (xxh3 default, crc32 without xxhash, sha256
on request), and the reference implementation's known answers."""

import hashlib
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import xxhash

from gpubox.provision import stage as st
from gpubox.provision.stage import hashing, sizes
from gpubox.simbox.model import make_model
from tests.stage.kit import (
    _files,
    _flip_byte,
    _stage,
)


@pytest.mark.parametrize("name", [None, "xxh3", "crc32", "sha256"])
def test_tree_hash_is_sha256_over_chunk_hashes(tmp_path, monkeypatch, name):
    """xxh3 (the default): XXH3-64 per chunk, 8 bytes big-endian; crc32: 4 big-endian bytes; sha256: the
    chunk digests; file = sha256 of them. The per-range digests are in the manifest too."""
    monkeypatch.setattr(sizes, "CHUNK", 64 << 10)  # several chunks in a small file
    src = tmp_path / "s"
    make_model(src, [400_000], seed=3)
    dest = tmp_path / "d"
    out = _stage(src, dest, hash=name)
    algo = {None: st.HASH_ALGO, **{k: v for k, v in st.HASHES.items()}}[name]
    man = json.loads((dest / st.MANIFEST).read_text())
    assert out["hash"] == man["hash"] == algo
    data = (src / "model.safetensors").read_bytes()
    parts = [data[i : i + sizes.CHUNK] for i in range(0, len(data), sizes.CHUNK)]
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


VECTORS = Path(__file__).parents[1] / "fixtures" / "stage" / "realworld" / "xxh3_sanity_vectors.txt"


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
    make = hashing.CHUNK_HASH["xxh3-tree-64MiB"]
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
