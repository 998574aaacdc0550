"""Room checks (room.py): refused with the figures, before anything is written."""

import pytest

from gpubox.provision import stage as st
from tests.stage.kit import _files, _stage


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
