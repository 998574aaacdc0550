"""The source (source.py and the integrity check before copying): an incomplete model is refused, a Hugging
Face cache blob is checked against the hub's sha256."""

import hashlib
import json
import os

import pytest

from gpubox.provision import safetensors_check as stc
from gpubox.provision import stage as st
from gpubox.simbox.model import make_model
from tests.clirun import gpubox
from tests.stage.kit import _stage


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


def test_a_single_file_model_stages_without_force_and_a_bad_header_is_one_line(tmp_path, capsys):
    """One .gguf (no config.json, no tokenizer) is a model: staged and checked as staged, no
    --force; the same directory with a broken GGUF header is refused before anything is written,
    exit 2, one line naming the file and the fix."""
    src, dest = tmp_path / "persistent" / "Q", tmp_path / "shm" / "Q"
    src.mkdir(parents=True)
    gguf = src / "model-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") * 2 + b"\1" * 4096)
    code, out, err = gpubox(capsys, "stage", src, dest, "--json")
    assert code == 0, err
    assert json.loads(out)["copied"] == 1 and (dest / gguf.name).read_bytes() == gguf.read_bytes()
    c = st.check(str(src), str(dest), verify=True)
    assert c["staged"] is True and c["problems"] == [] and c["verified"] == 1
    gguf.write_bytes(b"GGML" + gguf.read_bytes()[4:])
    fresh = tmp_path / "shm" / "R"
    code, out, err = gpubox(capsys, "stage", src, fresh)
    assert code == 2 and out == "" and not fresh.exists()
    assert err.count("\n") == 1 and f"source {src} is not a complete model: " in err
    assert "model-Q4_K_M.gguf: not a GGUF file (magic b'GGML', not b'GGUF')" in err
    assert "(repair the source (or pass --force to copy it as it is))" in err
