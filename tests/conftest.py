"""Shared test setup: every test gets its own gpubox state dir and never the user's inventory.

Plugins: tests.sshd gives the `sshd` / `sshd_factory` fixtures (a real sshd on loopback).
"""

import pytest

pytest_plugins = ["tests.sshd"]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "gpubox-state"))
    monkeypatch.delenv("GPUBOX_INVENTORY", raising=False)
    yield
