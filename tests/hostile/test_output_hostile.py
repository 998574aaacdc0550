"""Safe output: reports, plots, result files and history are created without following what already
stands at their names, a failed report leaves nothing, and ENOSPC/EROFS name the file. Backups
are never left 0 bytes long."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.clirun import gpubox

FIX = Path(__file__).resolve().parents[1] / "fixtures"
AFTER = FIX / "results" / "seed-after.json"
BEFORE = FIX / "results" / "seed-before.json"


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("precious\n")
    return v


@pytest.mark.parametrize("fmt,name", [("md", "report.md"), ("html", "report.html"), ("latex", "report.tex")])
def test_report_replaces_a_planted_symlink_instead_of_following_it(tmp_path, capsys, victim, fmt, name):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(victim)
    rc, _, err = gpubox(capsys, "report", AFTER, "--format", fmt, "-o", out)
    assert rc == 0, err
    assert victim.read_text() == "precious\n", "DAMAGE: the report was written through a planted symlink"
    assert not (out / name).is_symlink() and (out / name).stat().st_size > 0


def test_report_figure_symlink_is_not_followed(tmp_path, capsys, victim):
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "tok_s_by_tp.png").symlink_to(victim)
    rc, _, err = gpubox(capsys, "report", AFTER, "--format", "md", "-o", out)
    assert victim.read_text() == "precious\n", "DAMAGE: a plot was written through a planted symlink"


def test_report_into_a_symlinked_figures_dir_writes_nothing_there(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").symlink_to(elsewhere)
    rc, _, err = gpubox(capsys, "report", AFTER, "--format", "md", "-o", out)
    assert list(elsewhere.iterdir()) == [], "DAMAGE: figures written into a directory a symlink points at"
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_a_failing_render_leaves_nothing(tmp_path, capsys, monkeypatch):
    from gpubox.bench.report import markdown

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(markdown, "render_markdown", boom)
    out = tmp_path / "out"
    rc, _, err = gpubox(capsys, "report", AFTER, "--format", "md", "-o", out)
    assert rc == 2 and "ENOSPC" in err and "Traceback" not in err, err
    left = [p.name for p in out.rglob("*")] if out.exists() else []
    assert left == [], f"a failed report left {left}"


def test_history_plot_replaces_a_planted_symlink(tmp_path, capsys, victim):
    from gpubox.bench import history, regress

    for n in (1, 2, 3):
        history.record(
            regress.with_verdict(json.loads((FIX / "history" / f"run{n:02d}.json").read_text()), [])
        )
    png = tmp_path / "plot.png"
    png.symlink_to(victim)
    rc, _, err = gpubox(capsys, "history", "ct200", "--plot", png)
    assert victim.read_text() == "precious\n", "DAMAGE: the plot was written through a planted symlink"
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_history_store_symlink_is_refused(tmp_path, victim):
    from gpubox.bench import history
    from gpubox.errors import GpuboxError

    doc = json.loads((FIX / "history" / "run01.json").read_text())
    path = history.store_path(doc["box"])
    path.symlink_to(victim)
    with pytest.raises(GpuboxError) as ei:
        history.record(doc)
    assert victim.read_text() == "precious\n", "DAMAGE: the history was appended through a symlink"
    assert str(path) in str(ei.value)


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EDQUOT", "EIO"])
def test_result_write_error_names_the_file_and_leaves_no_temp(tmp_path, monkeypatch, code):
    from gpubox.bench import results
    from gpubox.errors import GpuboxError

    doc = json.loads(AFTER.read_text())
    real_write = os.write
    n = getattr(errno, code)

    def failing(fd, data):
        raise OSError(n, os.strerror(n))

    monkeypatch.setattr(os, "write", failing)
    with pytest.raises(GpuboxError) as ei:
        results.write(doc, tmp_path / "out")
    monkeypatch.setattr(os, "write", real_write)
    msg = str(ei.value)
    assert code in msg and str(tmp_path / "out") in msg, msg
    assert list((tmp_path / "out").iterdir()) == []


def test_backup_on_a_full_disk_leaves_no_empty_backup(tmp_path, monkeypatch):
    from gpubox.errors import GpuboxError
    from gpubox.host import Host
    from gpubox.inventory import HostEntry
    from gpubox.state import state_dir
    from gpubox.transport.local import LocalTransport

    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "x.conf").write_text("old\n")
    h = Host(HostEntry("pve1", {"gpubox_root": str(root)}), LocalTransport("pve1"))
    real_write = os.write

    def failing(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", failing)
    try:
        with pytest.raises((GpuboxError, OSError)) as ei:
            h.write("/etc/x.conf", "new\n")
    finally:
        monkeypatch.setattr(os, "write", real_write)
    assert "ENOSPC" in str(ei.value) or "No space" in str(ei.value)
    empty = [p for p in state_dir().rglob("*") if p.is_file() and p.stat().st_size == 0]
    assert empty == [], f"DAMAGE: 0-byte backup left: {empty}"
    assert (root / "etc" / "x.conf").read_text() == "old\n", "DAMAGE: written without its backup"


def test_report_of_hostile_text_renders(tmp_path, capsys):
    """mathtext ($\\frac{$), rich markup ([/]) and an ESC sequence in a run name and a reason."""
    doc = json.loads(AFTER.read_text())
    doc["verdict"]["reasons"] = [{"level": "degraded", "message": "\x1b[2J[/] $\\frac{$ 100% & #_"}]
    for m in doc["measurements"]:
        m["label"] = "$\\frac{$[/]"
        break
    f = tmp_path / "$\\frac{$[bold].json"
    f.write_text(json.dumps(doc))
    out = tmp_path / "out"
    rc, stdout, err = gpubox(capsys, "report", BEFORE, f, "--compare", "--format", "md", "-o", out)
    assert rc == 0, err
    assert "\x1b" not in stdout + err
    shutil.rmtree(out)


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EIO"])
def test_box_file_write_error_names_the_file(tmp_path, monkeypatch, code):
    """The host transport's atomic write: fsync(2)/write(2) errors carry no file name of their own."""
    from gpubox.errors import os_error
    from gpubox.transport.local import LocalTransport

    target = tmp_path / "etc" / "sysctl.d" / "90-gpubox.conf"
    target.parent.mkdir(parents=True)
    n = getattr(errno, code)

    def failing(fd):
        raise OSError(n, os.strerror(n))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as ei:
        LocalTransport("pve1").write_bytes_atomic(str(target), b"kernel.numa_balancing = 0\n")
    monkeypatch.undo()
    assert str(target) in str(os_error(ei.value)) and code in str(os_error(ei.value))
    assert list(target.parent.iterdir()) == [], "a temp file was left behind"
