"""The journal and the partials (manifest.py): an interrupted or killed run resumes, inside a file too;
what cannot be trusted is not resumed."""

import json
from pathlib import Path

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import sizes
from tests.stage.kit import _big_model, _files, _kill_mid_range, _stage


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


def test_resume_after_a_kill_mid_file_keeps_the_journaled_ranges(tmp_path, monkeypatch):
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
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
        f.seek(sizes.CHUNK + 10)
        b = f.read(1)
        f.seek(sizes.CHUNK + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    out = _stage(src, dest)
    assert out["resumed_bytes"] == 4 * sizes.CHUNK
    assert (dest / shard.name).read_bytes() == shard.read_bytes()
    assert not partial.exists() and not (dest / st.JOURNAL).exists()
    assert st.check(str(src), str(dest), verify=True)["verified"] == len(_files(src))


def test_partial_of_a_changed_source_is_not_resumed(tmp_path, monkeypatch):
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
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
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    _big_model(src, seed=24)
    _kill_mid_range(src, dest, after=8)
    total = sum(p.stat().st_size for p in src.iterdir())
    free = total - 8 * sizes.CHUNK + (64 << 10)  # too little for everything, enough for the rest
    out = _stage(src, dest, tmpfs=True, free_space=lambda d: free, margin=0)
    assert out["resumed_bytes"] == 8 * sizes.CHUNK and out["room"]["need"] <= total - 8 * sizes.CHUNK
    with pytest.raises(st.StageError, match="needs"):
        _stage(src, tmp_path / "fresh", tmpfs=True, free_space=lambda d: free, margin=0)


def test_unreadable_range_records_are_not_trusted(tmp_path, monkeypatch):
    """Range lines cut or garbled by the kill (bad digest, range out of the file) resume nothing:
    the partial is removed and the file copied whole."""
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
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
