"""check and stage end to end (operations.py): what a run copies, what a second run does, the dry run."""

import json

from gpubox.provision import stage as st
from tests.stage.kit import (
    _files,
    _stage,
)


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


def test_second_run_copies_nothing(model, tmp_path):
    dest = tmp_path / "d"
    _stage(model, dest)
    before = {r: (dest / r).stat().st_ino for r in _files(dest)}
    out = _stage(model, dest)
    assert out["copied"] == 0 and out["skipped"] == len(_files(model)) and out["reasons"] == {}
    assert {r: (dest / r).stat().st_ino for r in _files(dest)} == before


def test_dry_run_changes_nothing(model, tmp_path):
    dest = tmp_path / "d"
    out = _stage(model, dest, dry_run=True)
    assert out["would_copy"] == _files(model) and out["would_copy_bytes"] == out["bytes"]
    assert not dest.exists()


def test_empty_file_staged_and_verified(model, tmp_path):
    (model / "empty.txt").write_bytes(b"")
    dest = tmp_path / "d"
    _stage(model, dest)
    assert (dest / "empty.txt").read_bytes() == b""
    assert st.check(str(model), str(dest), verify=True)["verified"] == len(_files(model))
