"""The payload runner on a hostile container: its working directory, its interpreter's start-up and
exit, an interpreter too old or silent. Run for real with the system python3 (what a container
has) through the local transport.

- a `json.py` (and `zipfile.py`, `runpy.py`) in the working directory is never imported;
- a line printed at interpreter exit (an atexit hook from sitecustomize) or at start does not hide
  the entry's answer: the answer is read between the run's markers;
- a python older than payload.MIN_PYTHON is refused by the loader before the entry runs, and by
  `check_python` in one short call;
- an interpreter that never answers is given up on within check_python's deadline."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from gpubox.errors import GpuboxError
from gpubox.transport import payload
from gpubox.transport.local import LocalTransport

BARE = "/usr/bin/python3"


@pytest.fixture
def python():
    if not os.path.exists(BARE):
        pytest.skip(f"{BARE} is not installed")
    return BARE


class _In(LocalTransport):
    """The local transport with a fixed working directory and environment (a container's)."""

    def __init__(self, cwd, env=None):
        super().__init__()
        self._cwd, self._env = str(cwd), env or {}

    def run(self, argv, **kw):
        kw["cwd"] = self._cwd
        kw["env"] = {**(kw.get("env") or {}), **self._env}
        return super().run(argv, **kw)


def test_modules_in_the_working_directory_are_never_imported(tmp_path, python):
    trap = tmp_path / "TRAPPED"
    for name in ("json", "zipfile", "runpy", "hashlib", "io"):
        (tmp_path / f"{name}.py").write_text(f"open({str(trap)!r}, 'a').write('{name}\\n')\n")
    r = payload.run(_In(tmp_path), "gpubox.provision.cuda_probe", [], python=python, timeout=120)
    assert not trap.exists(), f"DAMAGE: the container's cwd module ran: {trap.read_text()}"
    assert r.rc == 0, r.stderr
    assert isinstance(json.loads(r.stdout), dict)


def test_lines_printed_at_start_and_exit_do_not_hide_the_answer(tmp_path, python):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import atexit, sys\n"
        "sys.stdout.write('noise at start\\n')\n"
        'atexit.register(lambda: print(\'{"not": "the answer"}\'))\n'
    )
    r = payload.run(
        _In(tmp_path, {"PYTHONPATH": str(site)}),
        "gpubox.provision.cuda_probe",
        [],
        python=python,
        timeout=120,
    )
    assert r.rc == 0, r.stderr
    doc = json.loads(r.stdout)
    assert "nodes" in doc and "not" not in doc


def test_framed_takes_only_the_entry_output():
    n = "abc"
    text = f"junk\n{payload.BEGIN % n}\n{{}}\n\n{payload.END % n}\nexit noise\n"
    assert payload.framed(text, n) == "{}\n"
    assert payload.framed("no markers\n", n) == "no markers\n"  # the entry never ran
    assert payload.framed(f"\n{payload.BEGIN % n}\npartial", n) == "partial"  # ended itself
    forged = f"{payload.BEGIN % n}\n{{}}\n{payload.END % 'other'}\n"
    assert payload.framed(forged, n) == f"{{}}\n{payload.END % 'other'}\n"


def test_a_python_too_old_is_refused_before_the_entry_runs(tmp_path, python, monkeypatch):
    monkeypatch.setattr(payload, "MIN_PYTHON", (99, 0))
    trap = tmp_path / "ran"
    r = payload.run(_In(tmp_path), "gpubox.provision.cuda_probe", [str(trap)], python=python, timeout=120)
    assert r.rc == 2 and "needs python >= 99.0" in r.stderr
    assert r.stdout.strip() == ""
    with pytest.raises(GpuboxError, match="needs >= 99.0"):
        payload.check_python(LocalTransport(), python)


def test_a_silent_python_is_given_up_within_the_check_deadline(tmp_path):
    silent = tmp_path / "python3"
    silent.write_text("#!/bin/sh\nexec sleep 600\n")
    silent.chmod(0o755)
    t0 = time.monotonic()
    with pytest.raises(GpuboxError, match="did not answer"):
        payload.check_python(LocalTransport(), str(silent), timeout=2)
    assert time.monotonic() - t0 < 120  # not the payload's hours: the check's own deadline


def test_check_python_answers_for_a_good_interpreter(python):
    have = payload.check_python(LocalTransport(), python)
    out = subprocess.run(
        [python, "-c", "import sys;print('%d.%d' % sys.version_info[:2])"], capture_output=True
    )
    assert have == out.stdout.decode().strip()
