"""What the destination holds against the source (destination.decide): found by the cheap check, by
--verify, and repaired."""

import os

from gpubox.provision import stage as st
from gpubox.provision.stage import sizes
from tests.stage.kit import _big_model, _files, _flip_byte, _stage


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


def test_verify_names_the_damaged_range(tmp_path, monkeypatch):
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
    src, dest = tmp_path / "s", tmp_path / "d"
    shard = _big_model(src, seed=25)
    _stage(src, dest)
    _flip_byte(dest / shard.name, back=sizes.CHUNK * 3)
    size = shard.stat().st_size
    i = (size - sizes.CHUNK * 3) // sizes.CHUNK
    v = st.stage(str(src), str(dest), verify=True, dry_run=True)
    want = (
        f"hash mismatch (corrupted in the destination): bytes {i * sizes.CHUNK}-{(i + 1) * sizes.CHUNK - 1}"
    )
    assert v["reasons"] == {shard.name: want}
