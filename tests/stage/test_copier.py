"""The copier (copier.py): a source file replaced or removed mid-copy is an error."""

import os

import pytest

from gpubox.provision import stage as st
from gpubox.provision.stage import sizes
from tests.stage.kit import _big_model, _stage


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_source_file_replaced_or_removed_mid_copy_is_an_error(tmp_path, monkeypatch, how):
    """A worker reads its stretch of a file through the fd it opened, so a file renamed over (a
    re-download) or removed after that would be copied whole from the old inode: the name is
    checked at the end of the file, exit 2, and no partial is left."""
    monkeypatch.setattr(sizes, "CHUNK", 128 << 10)
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
