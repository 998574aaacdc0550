"""The simulated /etc/pve behaves as pmxcfs does (pve-cluster src/pmxcfs/, and runs of the real
pmxcfs in local mode), and the config commit takes the path a real Proxmox host makes it take:
rename() without RENAME_EXCHANGE, re-read after, no chmod, no quorum named before any backup."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import stat

import pytest
import yaml

from gpubox.errors import GpuboxError
from gpubox.host import connect_box
from gpubox.inventory import Inventory
from gpubox.provision import lxcconf
from gpubox.provision.lxcconf import NO_QUORUM, conf_path, digest, read_conf, write_conf
from gpubox.simbox import build
from gpubox.simbox.pmxcfs import MAX_FILE, WWW_DATA, PmxcfsOps, set_quorate
from gpubox.transport.fsops import RENAME_EXCHANGE, RENAME_NOREPLACE
from tests.clirun import gpubox

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    return build(tmp_path_factory.mktemp("pmx") / "box", [], gpus=2)


@pytest.fixture
def fresh(tmp_path):
    return build(tmp_path / "box", ["uvm_stale_major"], gpus=2)


def _ops(sim) -> PmxcfsOps:
    return PmxcfsOps(sim.host_root)


def _host(sim):
    return connect_box(Inventory(sim.inventory_path).box(sim.box))[0]


def _create(ops, path, data=b"x", mode=0o644):
    fd = ops.open(str(path), FLAGS, mode)
    try:
        n = ops.write(fd, data)
    finally:
        ops.close(fd)
    return n


def _errno(fn, *a):
    with pytest.raises(OSError) as ei:
        fn(*a)
    return ei.value.errno


# -- the facts, one by one ------------------------------------------------------------------------


def test_lxc_local_qemu_server_are_links_to_this_nodes_directory(sim):
    pve = sim.hpath("/etc/pve")
    assert os.readlink(pve / "lxc") == "nodes/pve1/lxc"
    assert os.readlink(pve / "qemu-server") == "nodes/pve1/qemu-server"
    assert os.readlink(pve / "local") == "nodes/pve1"
    assert (pve / "nodes/pve1/lxc/200.conf").read_bytes() == sim.hpath("/etc/pve/lxc/200.conf").read_bytes()


def test_the_simulated_host_reaches_etc_pve_through_the_pmxcfs_rules(sim):
    host = _host(sim)
    assert isinstance(host.transport.ops, PmxcfsOps)
    st = host.stat("/etc/pve/lxc/200.conf")
    assert (st.perms, st.uid, st.gid) == (0o640, 0, WWW_DATA) and st.mtime == int(st.mtime)


@pytest.mark.parametrize("asked", [0o777, 0o600, 0o644, 0o400])
def test_every_file_shows_root_www_data_0640_whatever_mode_is_asked(sim, asked):
    ops = _ops(sim)
    p = sim.hpath(f"/etc/pve/lxc/asked-{asked:o}")
    _create(ops, p, mode=asked)
    for st in (ops.lstat(str(p)), os.lstat(p)):  # through the rules and on the simulated tree alike
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, WWW_DATA)
    ops.unlink(str(p))


def test_priv_is_0600_and_directories_0755(sim):
    ops = _ops(sim)
    p = sim.hpath("/etc/pve/priv/secret")
    _create(ops, p, mode=0o644)
    assert stat.S_IMODE(ops.lstat(str(p)).st_mode) == 0o600
    assert stat.S_IMODE(ops.lstat(str(sim.hpath("/etc/pve/priv"))).st_mode) == 0o700
    d = sim.hpath("/etc/pve/newdir")
    ops.mkdir(str(d), 0o700)
    assert stat.S_IMODE(ops.lstat(str(d)).st_mode) == 0o755
    os.rmdir(d)
    ops.unlink(str(p))


def test_chmod_to_another_mode_and_chown_fail_eperm(sim):
    ops = _ops(sim)
    conf = str(sim.hpath("/etc/pve/lxc/200.conf"))
    ops.chmod(conf, 0o640)  # the mode it has: accepted
    ops.chown(conf, 0, WWW_DATA)
    assert _errno(ops.chmod, conf, 0o644) == errno.EPERM
    assert _errno(ops.chmod, conf, 0o600) == errno.EPERM
    assert _errno(ops.chown, conf, 1000, -1) == errno.EPERM
    assert _errno(ops.chown, conf, 0, 0) == errno.EPERM
    assert stat.S_IMODE(os.lstat(conf).st_mode) == 0o640


def test_links_fifos_and_xattrs_are_refused(sim):
    ops = _ops(sim)
    conf = str(sim.hpath("/etc/pve/lxc/200.conf"))
    assert _errno(ops.link, conf, conf + ".hard") == errno.EPERM
    assert _errno(ops.symlink, "200.conf", conf + ".sym") == errno.ENOSYS
    assert _errno(ops.mkfifo, conf + ".fifo") == errno.ENOSYS
    assert _errno(ops.setxattr, conf, "user.x", b"1") == errno.ENOTSUP
    assert not any(os.path.lexists(conf + s) for s in (".hard", ".sym", ".fifo"))


def test_rename_exchange_and_noreplace_fail_einval_plain_rename_works(sim):
    ops = _ops(sim)
    a = sim.hpath("/etc/pve/lxc/a.tmp")
    b = sim.hpath("/etc/pve/lxc/b.tmp")
    _create(ops, a, b"A")
    _create(ops, b, b"B")
    assert _errno(ops.rename2, str(a), str(b), RENAME_EXCHANGE) == errno.EINVAL
    assert _errno(ops.rename2, str(a), str(sim.hpath("/etc/pve/lxc/c.tmp")), RENAME_NOREPLACE) == errno.EINVAL
    assert ops.exchange(str(a), str(b)) is False
    ops.replace(str(a), str(b))
    assert b.read_bytes() == b"A" and not a.exists()
    ops.unlink(str(b))


def test_exactly_one_mib_is_allowed_one_byte_more_is_short_then_efbig(sim):
    ops = _ops(sim)
    ok = sim.hpath("/etc/pve/lxc/full")
    assert _create(ops, ok, b"a" * MAX_FILE) == MAX_FILE
    big = sim.hpath("/etc/pve/lxc/over")
    fd = ops.open(str(big), FLAGS, 0o640)
    try:
        assert ops.write(fd, b"b" * (MAX_FILE + 1)) == MAX_FILE  # a short write
        assert _errno(ops.write, fd, b"b") == errno.EFBIG
    finally:
        ops.close(fd)
    assert big.stat().st_size == MAX_FILE  # the partial file stays
    ops.unlink(str(ok))
    ops.unlink(str(big))


def test_a_vmid_that_is_a_vm_or_on_another_node_gives_eexist_also_on_rename(sim):
    ops = _ops(sim)
    vm = sim.hpath("/etc/pve/qemu-server/200.conf")
    assert _errno(_create, ops, vm) == errno.EEXIST and not vm.exists()
    other = sim.hpath("/etc/pve/nodes/pve2/lxc")
    other.mkdir(parents=True)
    (other / "300.conf").write_text("arch: amd64\n")
    tmp = sim.hpath("/etc/pve/lxc/300.conf.tmp.4242")
    _create(ops, tmp, b"arch: amd64\n")
    assert _errno(ops.replace, str(tmp), str(sim.hpath("/etc/pve/lxc/300.conf"))) == errno.EEXIST
    assert tmp.exists() and not sim.hpath("/etc/pve/lxc/300.conf").exists()  # the tmp stays
    ops.unlink(str(tmp))
    (other / "300.conf").unlink()
    other.rmdir()
    other.parent.rmdir()


def test_mtimes_are_whole_seconds(sim):
    ops = _ops(sim)
    p = sim.hpath("/etc/pve/lxc/stamp")
    _create(ops, p)
    ops.utime(str(p), (1000.75, 2000.5))
    assert ops.lstat(str(p)).st_mtime == 2000 and os.lstat(p).st_mtime == 2000
    ops.unlink(str(p))


def test_what_behaves_as_a_plain_directory(sim):
    ops = _ops(sim)
    d = str(sim.hpath("/etc/pve/lxc"))
    p = os.path.join(d, ".dot")
    fd = ops.open(p, FLAGS | os.O_NOFOLLOW, 0o640)  # O_EXCL and O_NOFOLLOW through the lxc link
    ops.fsync(fd)
    ops.close(fd)
    assert _errno(ops.open, p, FLAGS, 0o640) == errno.EEXIST
    dfd = os.open(d, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    assert ".dot" in ops.listdir(d)
    ops.unlink(p)


def test_without_quorum_every_write_is_eacces_and_reads_work(fresh):
    ops = _ops(fresh)
    conf = fresh.hpath("/etc/pve/lxc/200.conf")
    before = conf.read_bytes()
    set_quorate(fresh, False)
    assert ops.read_bytes(str(conf)) == before
    assert stat.S_IMODE(ops.lstat(str(conf)).st_mode) == 0o440
    assert stat.S_IMODE(ops.lstat(str(fresh.hpath("/etc/pve/nodes/pve1/lxc"))).st_mode) == 0o555
    assert _errno(ops.open, str(conf), os.O_WRONLY | os.O_TRUNC) == errno.EACCES
    assert _errno(_create, ops, fresh.hpath("/etc/pve/lxc/new")) == errno.EACCES
    assert _errno(ops.unlink, str(conf)) == errno.EACCES
    assert _errno(ops.mkdir, str(fresh.hpath("/etc/pve/d"))) == errno.EACCES
    assert conf.read_bytes() == before
    set_quorate(fresh, True)
    assert stat.S_IMODE(ops.lstat(str(conf)).st_mode) == 0o640


# -- the commit path on it ------------------------------------------------------------------------


def test_the_commit_takes_rename_without_exchange_and_rereads_after(fresh, monkeypatch):
    host = _host(fresh)
    conf, dig = read_conf(host, 200)
    new = conf.render().replace("c 508:* rwm", "c 511:* rwm")
    seen = []
    real_rename = lxcconf._rename
    monkeypatch.setattr(lxcconf, "_rename", lambda ops, a, b: seen.append(real_rename(ops, a, b)) or seen[-1])
    write_conf(host, 200, new, dig)
    assert seen == [False]  # the exchange was refused: rename() committed, as on a real host
    assert fresh.hpath("/etc/pve/lxc/200.conf").read_text() == new
    assert [n for n in os.listdir(fresh.hpath("/etc/pve/lxc")) if n != "200.conf"] == []


def test_after_swap_check_catches_a_write_right_after_the_rename(fresh, monkeypatch):
    """A writer without the lock writes between gpubox's rename() and its re-read: the run fails,
    their edit stays, and gpubox's backup holds the file as checked."""
    host = _host(fresh)
    conf, dig = read_conf(host, 200)
    new = conf.render().replace("c 508:* rwm", "c 511:* rwm")
    path = fresh.hpath("/etc/pve/lxc/200.conf")
    theirs = conf.render() + "# edited by hand\n"
    real_rename = lxcconf._rename

    def rename_then_someone_writes(ops, a, b):
        swapped = real_rename(ops, a, b)
        path.write_text(theirs)
        return swapped

    monkeypatch.setattr(lxcconf, "_rename", rename_then_someone_writes)
    with pytest.raises(GpuboxError, match="changed right after it was replaced") as ei:
        write_conf(host, 200, new, dig)
    assert "other edit is kept" in str(ei.value) and path.read_text() == theirs


def test_no_quorum_is_named_before_any_backup_and_nothing_is_written(fresh, tmp_path, capsys):
    set_quorate(fresh, False)
    before = fresh.hpath("/etc/pve/lxc/200.conf").read_bytes()
    rc, out, err = gpubox(capsys, "-i", fresh.inventory_path, "lxc", "fix", "ct200", "--yes", "--json")
    doc = json.loads(out)
    cc = {s["name"]: s for s in doc["steps"]}["container-config"]
    assert rc != 0 and cc["status"] == "failed" and NO_QUORUM in cc["detail"]
    assert fresh.hpath("/etc/pve/lxc/200.conf").read_bytes() == before
    from gpubox.state import state_dir

    def conf_backups():
        return [p for p in state_dir().rglob("*") if p.name.startswith("etc__pve__lxc__200.conf.")]

    assert conf_backups() == []
    set_quorate(fresh, True)  # the same run with quorum does write its backup there
    rc, out, err = gpubox(capsys, "-i", fresh.inventory_path, "lxc", "fix", "ct200", "--yes", "--json")
    assert len(conf_backups()) == 1 and conf_backups()[0].read_bytes() == before


def test_write_conf_without_quorum_is_one_line(fresh):
    host = _host(fresh)
    conf, dig = read_conf(host, 200)
    set_quorate(fresh, False)
    with pytest.raises(GpuboxError) as ei:
        write_conf(host, 200, conf.render().replace("508", "511"), dig)
    assert ei.value.problem == NO_QUORUM and len(str(ei.value).splitlines()) == 1


def test_a_full_backup_directory_leaves_the_config_unchanged(fresh, monkeypatch):
    from gpubox import safepath

    host = _host(fresh)
    conf, dig = read_conf(host, 200)
    before = fresh.hpath("/etc/pve/lxc/200.conf").read_bytes()

    def enospc(*args, **kw):  # the state directory's file system is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safepath, "write", enospc)
    with pytest.raises(GpuboxError, match="not changed: its backup could not be written") as ei:
        write_conf(host, 200, conf.render().replace("508", "511"), dig)
    assert "No space left" in str(ei.value) and len(str(ei.value).splitlines()) == 1
    assert fresh.hpath("/etc/pve/lxc/200.conf").read_bytes() == before
    assert [n for n in os.listdir(fresh.hpath("/etc/pve/lxc")) if n != "200.conf"] == []


def test_vmid_clash_on_commit_is_one_line_and_leaves_no_temp(fresh):
    host = _host(fresh)
    conf, dig = read_conf(host, 200)
    other = fresh.hpath("/etc/pve/nodes/pve2/qemu-server")
    other.mkdir(parents=True)
    (other / "200.conf").write_text("memory: 512\n")
    with pytest.raises(GpuboxError, match="VMID 200 is also a VM"):
        write_conf(host, 200, conf.render().replace("508", "511"), dig)
    assert [n for n in os.listdir(fresh.hpath("/etc/pve/lxc")) if n != "200.conf"] == []


def _killed_at_commit(inventory_path, box, text, dig):
    from gpubox.host import connect_box as cb

    lxcconf._rename = lambda ops, a, b: os._exit(9)  # SIGKILL-like: the process ends at the commit point
    write_conf(cb(Inventory(inventory_path).box(box))[0], 200, text, dig)


def test_a_run_killed_at_the_commit_leaves_its_temp_and_the_next_removes_only_its_own(fresh):
    host = _host(fresh)
    conf, dig = read_conf(host, 200)
    new = conf.render().replace("c 508:* rwm", "c 511:* rwm")
    lxc_dir = fresh.hpath("/etc/pve/lxc")
    proxmox_tmp = lxc_dir / "200.conf.tmp.1"  # a live writer's (Proxmox-named) temp: pid 1 runs
    p = multiprocessing.get_context("fork").Process(
        target=_killed_at_commit, args=(str(fresh.inventory_path), fresh.box, new, dig)
    )
    p.start()
    p.join(60)
    assert p.exitcode == 9
    left = [n for n in os.listdir(lxc_dir) if n != "200.conf"]
    assert (
        left == [f"200.conf.tmp.{p.pid}"]
        and fresh.hpath("/etc/pve/lxc/200.conf").read_text() == conf.render()
    )
    proxmox_tmp.write_text("a Proxmox task's\n")
    write_conf(host, 200, new, dig)
    assert sorted(os.listdir(lxc_dir)) == sorted(["200.conf", proxmox_tmp.name])
    assert fresh.hpath("/etc/pve/lxc/200.conf").read_text() == new


# -- over SSH, a target that refuses chmod ---------------------------------------------------------


def test_lxc_fix_over_ssh_on_a_target_that_refuses_chmod(tmp_path, capsys):
    """sftp-server refusing SETSTAT (chmod) everywhere, creating files 0600 (a mode pmxcfs gives:
    its priv/ files; umask 077 so gpubox's own 0600 lock file needs no chmod either, since a real
    host refuses chmod only under /etc/pve): the config's temp keeps the mode it got, and the
    commit is the remote flock + rename + re-read."""
    import tests.sshd as sshd_mod

    if not os.path.exists(sshd_mod.SSHD):
        pytest.skip("openssh-server is not installed")
    srv = sshd_mod.start_sshd(tmp_path / "sshd", sftp_opts="-u 077 -P setstat,fsetstat")
    try:
        sim = build(tmp_path / "box", ["uvm_stale_major"], gpus=2)
        inv = yaml.safe_load(sim.inventory_path.read_text())
        hv = inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
        hv.pop("ansible_connection")
        hv.update(srv.vars())
        path = tmp_path / "ssh-inventory.yml"
        path.write_text(yaml.safe_dump(inv))
        t = srv.transport()
        probe = str(tmp_path / "chmod-probe")
        t.write_bytes_atomic(probe, b"x")
        with pytest.raises(IOError):
            t.sftp.chmod(probe, 0o600)  # the target does refuse chmod
        rc, out, err = gpubox(capsys, "-i", path, "lxc", "fix", "ct200", "--yes", "--json")
        steps = {s["name"]: s for s in json.loads(out)["steps"]}
        assert steps["container-config"]["status"] == "fixed", steps["container-config"]
        text = sim.hpath(conf_path(200)).read_text()
        assert "c 511:* rwm" in text and "c 508:* rwm" not in text.split("\n[")[0]
        assert [n for n in os.listdir(sim.hpath("/etc/pve/lxc")) if n != "200.conf"] == []
        assert digest(text) != digest(b"")
        t.close()
    finally:
        srv.stop()


def test_proxmox_own_write_fails_without_quorum_as_pct_says(tmp_path):
    """The simulated pct writes through the same pmxcfs: `pct unlock` on a node without quorum fails
    with pve-cluster's cfs_write_file message, and the file keeps its lock."""
    from gpubox.simbox.cmds import pct
    from gpubox.simbox.core import StandinError

    sim = build(tmp_path / "box", ["conf_locked", "container_stopped"], gpus=2)
    set_quorate(sim, False)
    with pytest.raises(StandinError) as ei:
        pct.main(sim, ["unlock", "200"])
    assert ei.value.rc == 255
    assert str(ei.value).startswith("unable to open file '/etc/pve/nodes/pve1/lxc/200.conf.tmp.")
    assert str(ei.value).endswith("' - Permission denied")
    assert "lock: backup" in sim.hpath("/etc/pve/lxc/200.conf").read_text()
    set_quorate(sim, True)
    pct.main(sim, ["unlock", "200"])
    assert "lock: backup" not in sim.hpath("/etc/pve/lxc/200.conf").read_text()


def test_doctor_and_dry_run_name_the_missing_quorum_before_apply(fresh, capsys):
    set_quorate(fresh, False)
    before = fresh.hpath("/etc/pve/lxc/200.conf").read_bytes()
    for args in (("check",), ("fix", "--dry-run")):
        rc, out, err = gpubox(capsys, "-i", fresh.inventory_path, "lxc", *args, "ct200", "--json")
        cc = {s["name"]: s for s in json.loads(out)["steps"]}["container-config"]
        assert rc == 1 and cc["status"] == "failed" and cc["detail"].endswith(NO_QUORUM), cc
        assert "508" in cc["detail"] and "pvecm status" in cc["repair"]
    assert fresh.hpath("/etc/pve/lxc/200.conf").read_bytes() == before
    set_quorate(fresh, True)  # with quorum the same drift is a plan again
    rc, out, err = gpubox(capsys, "-i", fresh.inventory_path, "lxc", "check", "ct200", "--json")
    assert {s["name"]: s for s in json.loads(out)["steps"]}["container-config"]["status"] == "drift"
