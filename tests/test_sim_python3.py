"""The simulated hosts' python3 stand-in: it passes every command but the CUDA probe on to the
python3 next on PATH, and where that is a launcher script (pyenv's shim) to the interpreter the
launcher starts, asked once and remembered."""

import os
import subprocess
import sys
from pathlib import Path

from gpubox.simbox import build


def _launcher(d: Path, count: Path) -> Path:
    d.mkdir()
    p = d / "python3"
    p.write_text(f'#!/bin/sh\necho run >> "{count}"\nexec "{sys.executable}" "$@"\n')
    p.chmod(0o755)
    return p


def test_a_launcher_script_is_asked_once_then_the_interpreter_runs_directly(tmp_path):
    sim = build(tmp_path / "box")
    count = tmp_path / "launcher-runs"
    launcher_dir = tmp_path / "shims"
    _launcher(launcher_dir, count)
    env = dict(os.environ, PATH=f"{sim.bin_dir}{os.pathsep}{launcher_dir}{os.pathsep}/usr/bin:/bin")
    env.pop("PYTHONPATH", None)
    for _ in range(3):
        r = subprocess.run(
            ["python3", "-c", "import sys; print(sys.executable)"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        assert os.path.realpath(r.stdout.strip()) == os.path.realpath(sys.executable)
    assert count.read_text().count("run") == 1  # asked once; the memo answers after that
    assert (sim.bin_dir / ".python3-launchers.json").exists()


def test_a_python3_that_is_no_script_runs_as_found(tmp_path):
    sim = build(tmp_path / "box")
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "python3").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{sim.bin_dir}{os.pathsep}{real_dir}{os.pathsep}/usr/bin:/bin")
    r = subprocess.run(["python3", "-c", "print('hi')"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "hi\n", r.stderr
    assert not (sim.bin_dir / ".python3-launchers.json").exists()
