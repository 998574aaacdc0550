"""Shared test setup: every test gets its own gpubox state dir and never the user's inventory.

Plugins: tests.sshd gives the `sshd` / `sshd_factory` fixtures (a real sshd on loopback).
"""

import os
import sys

import pytest

# The tests run the tools of the environment they run in (ansible-playbook, ansible-lint, gpubox), also
# when started as `.venv/bin/python -m pytest` without activating the venv (README's test line).
_bindir = os.path.dirname(sys.executable)
if _bindir not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bindir + os.pathsep + os.environ.get("PATH", "")

pytest_plugins = ["tests.sshd"]

try:  # the fuzz tests keep no example database in the checkout (it would ride into built artefacts)
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("gpubox", database=None)
    _hyp_settings.load_profile("gpubox")
except ImportError:
    pass


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "gpubox-state"))
    monkeypatch.delenv("GPUBOX_INVENTORY", raising=False)
    # The output's width follows COLUMNS when it is set (a shell may export it, pytest-xdist's
    # workers have it): the tests read output as a pipe gives it, whatever shell runs them.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    yield


_PYTEST_PID = os.getpid()
_real_exit = os._exit


def _guarded_exit(code: int) -> None:
    """os._exit in the test process itself would end the whole run at once, with no summary (CI saw
    only an exit status): refuse it there. Forked children (multiprocessing) still leave as usual."""
    if os.getpid() == _PYTEST_PID:
        raise AssertionError(
            f"os._exit({code}) called in the pytest process; run that path in a child process"
        )
    _real_exit(code)


os._exit = _guarded_exit
