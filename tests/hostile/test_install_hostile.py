"""install.sh against hostile paths: a checkout path with a space, a ~/.local/bin/gpubox that is a
symlink to a directory or someone else's file, a failing pip. The shell script runs for real (sh);
the interpreter it is given is a recording stand-in for python3/venv/pip (a real pip install takes
minutes and is not what is under test: the arguments the script hands it are)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = lambda tmp_path: tmp_path / "home" / ".local" / "bin"  # noqa: E731

STUB = r"""#!/bin/sh
# python3 stand-in: -c (the venv check), -m venv DIR, -m pip install ARGS (one per line in $PIPLOG)
case "$1" in
  -c) exit 0 ;;
  -m)
    if [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi
    if [ "$2" = pip ]; then
      shift 2
      [ "$1" = install ] || exit 0
      shift
      case "$*" in *--upgrade*) exit 0 ;; esac
      for a in "$@"; do printf '%s\n' "$a" >> "$PIPLOG"; done
      [ -n "${PIPFAIL:-}" ] && exit 1
      d=$(dirname "$0"); printf '#!/bin/sh\n' > "$d/gpubox"; chmod +x "$d/gpubox"; exit 0
    fi ;;
esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path):
    """A copy of install.sh in a checkout whose path has a space."""
    d = tmp_path / "gpubox copy"
    d.mkdir()
    shutil.copy(ROOT / "install.sh", d / "install.sh")
    stub = tmp_path / "py"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return d, stub


def _run(checkout, tmp_path, *args, **env):
    d, stub = checkout
    fake = tmp_path / "fakebin"  # `id -u` says 1000: the per-user branch (~/.local/bin), never /usr/local/bin
    fake.mkdir(exist_ok=True)
    (fake / "id").write_text("#!/bin/sh\necho 1000\n")
    (fake / "id").chmod(0o755)
    e = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "GPUBOX_PYTHON": str(stub),
        "GPUBOX_PREFIX": str(tmp_path / "prefix dir"),
        "PIPLOG": str(tmp_path / "pip.log"),
        **env,
    }
    return subprocess.run(
        ["sh", str(d / "install.sh"), *args], capture_output=True, text=True, env=e, timeout=60
    )


def _pip_args(tmp_path):
    return (tmp_path / "pip.log").read_text().splitlines()


def test_checkout_path_with_a_space_is_one_argument(tmp_path, checkout):
    p = _run(checkout, tmp_path)
    assert p.returncode == 0, p.stderr
    assert _pip_args(tmp_path)[-1] == str(checkout[0]), "DAMAGE: pip got the path split in two"
    assert "-q" in _pip_args(tmp_path)


def test_dev_install_path_with_a_space(tmp_path, checkout):
    p = _run(checkout, tmp_path, "--dev")
    assert p.returncode == 0, p.stderr
    assert _pip_args(tmp_path)[-2:] == ["-e", f"{checkout[0]}[test]"]


def test_link_that_points_at_a_directory_is_replaced_not_followed(tmp_path, checkout):
    target_dir = tmp_path / "somedir"
    target_dir.mkdir()
    BIN(tmp_path).mkdir(parents=True)
    (BIN(tmp_path) / "gpubox").symlink_to(target_dir)
    p = _run(checkout, tmp_path)
    assert p.returncode == 0, p.stderr
    link = BIN(tmp_path) / "gpubox"
    assert os.readlink(link) == str(tmp_path / "prefix dir" / "venv" / "bin" / "gpubox")
    assert list(target_dir.iterdir()) == [], "DAMAGE: the link was made inside the directory"


def test_someone_elses_file_is_not_replaced(tmp_path, checkout):
    BIN(tmp_path).mkdir(parents=True)
    other = BIN(tmp_path) / "gpubox"
    other.write_text("#!/bin/sh\necho other tool\n")
    p = _run(checkout, tmp_path)
    assert p.returncode == 2 and "not a symlink" in p.stderr
    assert other.read_text() == "#!/bin/sh\necho other tool\n", "DAMAGE: another program was replaced"


def test_failing_pip_never_says_installed(tmp_path, checkout):
    p = _run(checkout, tmp_path, PIPFAIL="1")
    assert p.returncode != 0 and "installed" not in p.stdout
    assert not (BIN(tmp_path) / "gpubox").exists()
