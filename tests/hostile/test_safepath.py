"""gpubox.safepath, the layer under every write: both resolution paths (openat2 and the O_NOFOLLOW
walk) refuse a link at any component, never change the link's target, read only bounded regular
files, keep working files in a private directory, and judge the canonical path; the box lock's
inputs (its directory, lock file, holder record, $GPUBOX_LOCK_WAIT) hold against hostile values."""

from __future__ import annotations

import os
import stat
import time

import pytest

from gpubox import safepath as sp
from gpubox.errors import GpuboxError
from gpubox.simbox import build
from tests.clirun import gpubox

LINK = "is a symbolic link: gpubox does not write through links it did not make"


@pytest.fixture(params=["openat2", "walk"])
def how(request, monkeypatch):
    if request.param == "walk":
        monkeypatch.setenv("GPUBOX_NO_OPENAT2", "1")
    elif not sp.have_openat2():
        pytest.skip("this kernel has no openat2(2)")
    return request.param


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f").write_text("victim\n")
    os.chmod(victim / "f", 0o600)
    return root, victim


def _victim_state(victim):
    return sorted((p.name, p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in victim.iterdir())


@pytest.mark.parametrize("at", ["a", "a/b", "a/b/x"])
@pytest.mark.parametrize("op", ["write", "append", "makedirs", "remove", "read"])
def test_a_link_at_any_component_is_refused_and_its_target_untouched(tree, how, at, op):
    root, victim = tree
    target = root / at
    if target.is_dir():
        os.rename(target, root / "moved")
    os.symlink(victim if at != "a/b/x" else victim / "f", target)
    before = _victim_state(victim)
    a = sp.Anchor(root)
    try:
        if op == "write":
            call = lambda: sp.write(a, "a/b/x", b"new")  # noqa: E731
        elif op == "append":
            call = lambda: sp.append(a, "a/b/x", b"new")  # noqa: E731
        elif op == "makedirs":
            call = lambda: os.close(a.makedirs("a/b/x/y"))  # noqa: E731
        elif op == "remove":
            call = lambda: sp.remove(a, "a/b/x")  # noqa: E731
        else:
            call = lambda: sp.read(a, "a/b/x", 100)  # noqa: E731
        if op == "write" and at == "a/b/x":
            call()  # a link at the file's own name is replaced by rename(2), never followed
            assert not (root / at).is_symlink() and (root / at).read_bytes() == b"new"
        elif op == "remove" and at == "a/b/x":
            assert call() is True and not os.path.lexists(target)  # the link goes, not its target
        else:
            with pytest.raises((sp.Refused, OSError)) as ei:
                call()
            if isinstance(ei.value, sp.Refused):
                assert str(root / at) in str(ei.value) and LINK in str(ei.value)
    finally:
        a.close()
    assert _victim_state(victim) == before, "DAMAGE: the link's target changed"


def test_write_keeps_mode_through_the_fd_and_leaves_no_temp(tmp_path, how):
    a = sp.Anchor(tmp_path)
    old = os.umask(0o077)
    try:
        sp.write(a, "d/f", b"x", 0o644)
        assert stat.S_IMODE((tmp_path / "d" / "f").stat().st_mode) == 0o644
        os.chmod(tmp_path / "d" / "f", 0o640)
        sp.write(a, "d/f", b"y", None, keep_mode=True)
        assert stat.S_IMODE((tmp_path / "d" / "f").stat().st_mode) == 0o640
    finally:
        os.umask(old)
        a.close()
    assert sorted(os.listdir(tmp_path / "d")) == ["f"]


@pytest.mark.parametrize("what", ["fifo", "zero", "big"])
def test_reads_are_regular_files_only_and_bounded(tmp_path, how, what):
    p = tmp_path / "rec"
    if what == "fifo":
        os.mkfifo(p)
    elif what == "zero":
        os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    else:
        p.write_bytes(b"x" * 5000)
    t0 = time.monotonic()
    with sp.Anchor(tmp_path) as a, pytest.raises(sp.Refused) as ei:
        sp.read(a, "rec", 4096)
    assert time.monotonic() - t0 < 30  # the outcome ruled out is a hang, not a slow read
    assert str(p) in str(ei.value)


def test_remove_only_what_is_ours(tmp_path, how):
    (tmp_path / "theirs").write_text("x")
    os.chown(tmp_path / "theirs", 12345, 12345)
    (tmp_path / "dir").mkdir()
    with sp.Anchor(tmp_path) as a:
        with pytest.raises(sp.Refused, match="uid 12345"):
            sp.remove(a, "theirs")
        with pytest.raises(sp.Refused, match="not a regular file"):
            sp.remove(a, "dir")
        assert sp.remove(a, "absent") is False
    assert (tmp_path / "theirs").exists() and (tmp_path / "dir").is_dir()


def test_private_dir_made_0700_and_a_shared_or_foreign_one_refused(tmp_path, how):
    with sp.Anchor(tmp_path) as a:
        os.close(sp.private_dir(a, "p"))
        assert stat.S_IMODE((tmp_path / "p").stat().st_mode) == 0o700
        os.chmod(tmp_path / "p", 0o1777)
        with pytest.raises(sp.Refused, match="open to others"):
            sp.private_dir(a, "p")
        os.chmod(tmp_path / "p", 0o700)
        os.chown(tmp_path / "p", 12345, 12345)
        with pytest.raises(sp.Refused, match="belongs to uid 12345"):
            sp.private_dir(a, "p")
        os.symlink(tmp_path, tmp_path / "q")
        with pytest.raises(sp.Refused, match="symbolic link"):
            sp.private_dir(a, "q")


@pytest.mark.parametrize(
    "spelled, canon",
    [
        ("//dev/shm", "/dev/shm"),
        ("/dev/./shm/", "/dev/shm"),
        ("/dev/x/../shm", "/dev/shm"),
        ("///a//b/", "/a/b"),
    ],
)
def test_gates_judge_the_canonical_path(spelled, canon):
    assert sp.canonical(spelled) == canon
    if canon == "/dev/shm":
        assert sp.relative("/dev", spelled) == "shm"


def test_relative_refuses_a_path_that_climbs_out():
    with pytest.raises(sp.Refused, match="outside"):
        sp.relative("/srv/state", "/srv/state/../etc/passwd")


# -- the box lock's inputs ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e400", "86401", "soon"])
def test_lock_wait_that_is_no_number_of_seconds_is_one_line(tmp_path, capsys, monkeypatch, value):
    sim = build(tmp_path / "box", ("numa_balancing",))
    before = sim.hpath("/proc/sys/kernel/numa_balancing").read_bytes()
    monkeypatch.setenv("GPUBOX_LOCK_WAIT", value)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "numa", "ct200")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "GPUBOX_LOCK_WAIT" in err and "Traceback" not in err, err
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_bytes() == before


@pytest.mark.parametrize("what", ["fifo", "zero", "link-zero"])
def test_hostile_holder_record_is_ignored_at_once(tmp_path, capsys, monkeypatch, what):
    """A FIFO, a /dev/zero node or a link to one where the holder record goes: the run takes the
    lock and goes on (the record is not trusted, never read unbounded), within the test's time."""
    sim = build(tmp_path / "box", ("numa_balancing",))
    d = sim.hpath("/run/lock/gpubox")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    rec = d / "ct200.holder"
    if what == "fifo":
        os.mkfifo(rec)
    elif what == "zero":
        os.mknod(rec, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    else:
        os.symlink("/dev/zero", rec)
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "numa", "ct200")
    assert rc in (0, 1) and "Traceback" not in err and "MemoryError" not in err, err
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_text().strip() == "0"


@pytest.mark.parametrize("what", ["dir-link", "dir-shared", "dir-foreign", "file-link"])
def test_lock_directory_or_file_not_gpubox_own_is_refused(tmp_path, capsys, what):
    sim = build(tmp_path / "box", ("numa_balancing",))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "f").write_text("v\n")
    d = sim.hpath("/run/lock/gpubox")
    d.parent.mkdir(parents=True, exist_ok=True)
    if what == "dir-link":
        os.symlink(victim, d)
    else:
        d.mkdir(mode=0o700)
        if what == "dir-shared":
            os.chmod(d, 0o1777)
        elif what == "dir-foreign":
            os.chown(d, 12345, 12345)
        else:
            os.symlink(victim / "f", d / "ct200.lock")
    before = sorted((p.name, p.read_bytes()) for p in victim.iterdir())
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "tune", "numa", "ct200")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "/run/lock/gpubox" in err and "Traceback" not in err, err
    assert sorted((p.name, p.read_bytes()) for p in victim.iterdir()) == before, "DAMAGE: victim changed"
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_text().strip() != "0", "changed without the lock"


def test_refusal_is_a_gpubox_error():
    assert issubclass(sp.Refused, GpuboxError)


# -- staging on the layer --------------------------------------------------------------------------


@pytest.fixture
def model(tmp_path):
    from gpubox.simbox.model import make_model

    src = tmp_path / "src" / "m"
    make_model(src, [1 << 20, 1 << 20], seed=3)
    return src


def _stage(src, dest, **kw):
    """The copier, its StageError as the GpuboxError the CLI makes of it (exit 2, one line)."""
    from gpubox.provision import stage as st
    from gpubox.provision.stage.errors import StageError

    try:
        return st.stage(str(src), str(dest), workers=2, **kw)
    except StageError as exc:
        raise GpuboxError(exc.problem, exc.fix) from None


def test_stage_resume_partial_planted_as_a_link_next_to_a_forged_journal(model, tmp_path):
    """A journal that claims a resumable range of a shard, and the shard's .partial a link to a
    victim: the victim is never truncated, chmod'ed or written; the staged copy is still right."""
    from gpubox.provision.stage.manifest import JOURNAL

    dest = tmp_path / "shm" / "m"
    dest.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"v" * 4096)
    os.chmod(victim, 0o600)
    shard = sorted(p.name for p in model.iterdir() if p.suffix == ".safetensors")[0]
    info = model / shard
    rec = {"rel": shard, "size": info.stat().st_size, "mtime_ns": info.stat().st_mtime_ns, "range": [0, 4096]}
    (dest / JOURNAL).write_text(json_line(rec))
    os.symlink(victim, dest / f"{shard}.partial")
    try:
        _stage(model, dest)
    except GpuboxError as exc:
        assert "\n" not in str(exc)
    assert victim.read_bytes() == b"v" * 4096 and stat.S_IMODE(victim.stat().st_mode) == 0o600, "DAMAGE"


def json_line(rec) -> str:
    import json

    return json.dumps(rec) + "\n"


def test_stage_destination_reaching_into_the_source_through_a_link_is_refused(model, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    os.symlink(model, shm / "m")  # dest -> the persistent source
    before = sorted((p.name, p.stat().st_mtime_ns) for p in model.iterdir())
    with pytest.raises(GpuboxError, match="overlap"):
        _stage(model, shm / "m" / "sub")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in model.iterdir()) == before, "DAMAGE: source changed"


@pytest.mark.parametrize("spelled", ["{shm}", "{shm}/", "/{shm}/./"])
def test_stage_into_a_shared_directory_itself_is_refused(model, tmp_path, spelled):
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    os.chmod(shm, 0o1777)
    (shm / "other-program").write_text("not gpubox's\n")
    with pytest.raises(GpuboxError, match="of gpubox's own|overlap"):
        _stage(model, spelled.format(shm=shm))
    assert (shm / "other-program").read_text() == "not gpubox's\n"


def test_stage_leaves_no_lock_file_in_the_shared_directory(model, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    os.chmod(shm, 0o1777)
    _stage(model, shm / "m")
    assert sorted(os.listdir(shm)) == ["m"], os.listdir(shm)


def test_stage_lock_planted_as_a_link_never_truncates_its_target(model, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    os.chmod(shm, 0o1777)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    os.symlink(tmp_path, shm / ".gpubox-stage")  # the private lock directory, planted
    with pytest.raises(GpuboxError, match="symbolic link"):
        _stage(model, shm / "m")
    os.unlink(shm / ".gpubox-stage")
    os.symlink(victim, shm / ".m.gpubox-stage.lock")  # an older release's lock name, planted
    _stage(model, shm / "m")
    assert victim.read_text() == "keep me\n", "DAMAGE"


@pytest.mark.parametrize("dest", ["//dev/shm", "/dev/shm/", "/dev/./shm", "/dev/shm/x/..", "//dev"])
def test_stage_step_gate_judges_the_canonical_destination(dest):
    """`//dev/shm` is /dev/shm: refused as a destination like the plain spelling."""
    from types import SimpleNamespace

    from gpubox.provision.stage_step import model_spec

    setting = {"source": "/mnt/m", "dest": dest}
    ctx = SimpleNamespace(box=SimpleNamespace(var=lambda name: setting if name == "gpubox_model" else None))
    with pytest.raises(GpuboxError, match="directory of its own"):
        model_spec(ctx, "gpubox_model")
