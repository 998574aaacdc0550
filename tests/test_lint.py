"""The formatter and the linter configured in pyproject.toml ([tool.ruff]) hold for the tree."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return [exe]


def test_ruff_check_is_clean():
    r = subprocess.run(_ruff() + ["check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_format_is_applied():
    r = subprocess.run(
        _ruff() + ["format", "--no-cache", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
