"""Fixtures of the copier's tests (tests/stage/: one test module per module of provision/stage/)."""

import pytest

from gpubox.simbox.model import make_model

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
