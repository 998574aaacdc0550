"""One stager at a time (lock.py)."""

import subprocess
import sys

import pytest

from gpubox.provision import stage as st
from tests.stage.kit import (
    _files,
    _stage,
)


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
