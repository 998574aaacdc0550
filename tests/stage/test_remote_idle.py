"""A container python that falls silent mid-copy is ended by the copier's idle limit, not waited on
for the copy's hours-long timeout (issue 37: every wait is bounded)."""

from __future__ import annotations

import sys

import pytest

from gpubox.errors import GpuboxError
from gpubox.transport.local import LocalTransport
from provision import stage_step


class _Container(LocalTransport):
    """This machine standing in for a container reached by a remote transport (payload path)."""

    @property
    def is_local(self) -> bool:
        return False

    @property
    def transport(self):
        return self


def test_a_silent_container_python_is_ended_by_the_idle_limit(tmp_path, monkeypatch):
    # python3 there answers the version check (-I -c ...), then hangs without a word on the copy
    fake = tmp_path / "python3"
    fake.write_text(f'#!/bin/sh\ncase "$1" in -I) exec {sys.executable} "$@";; esac\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(stage_step, "REMOTE_IDLE", 1)
    with pytest.raises(GpuboxError) as ei:
        stage_step.copier(_Container("ct200"), {"op": "stage"})
    assert "said nothing for 1 s on ct200" in str(ei.value)
    assert stage_step.REMOTE_TIMEOUT >= 3600  # the copy itself still gets hours
