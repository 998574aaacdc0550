"""The safe write of /etc/pve/lxc/<vmid>.conf: lock, digest, tmp + rename, backup, crash safety."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import stat

import pytest

from gpubox.errors import GpuboxError
from gpubox.host import Host
from gpubox.provision import lxcconf
from gpubox.provision.lxcconf import conf_path, digest, read_conf, write_conf
from gpubox.transport.local import LocalTransport
from tests.lxc_fakehost import STALE_NEW, STALE_OLD, host_with_stale_conf

OLD, NEW = STALE_OLD, STALE_NEW


@pytest.fixture
def host(tmp_path):
    return host_with_stale_conf(tmp_path / "pve1")


def _real(h):
    return h.path(conf_path(200))


def _leftovers(h):
    d = os.path.dirname(_real(h))
    return [n for n in os.listdir(d) if n != "200.conf"]


def test_write_replaces_keeps_0640_and_backs_up(host, tmp_path):
    backup = write_conf(host, 200, NEW, digest(OLD))
    assert open(_real(host)).read() == NEW
    assert stat.S_IMODE(os.stat(_real(host)).st_mode) == 0o640
    assert open(backup, "rb").read() == OLD and str(tmp_path / "gpubox-state") in backup
    assert not backup.startswith(host.path("/etc/pve"))
    assert _leftovers(host) == []
    assert os.path.exists(host.path("/run/lock/lxc/pve-config-200.lock"))


def test_digest_changed_since_check_aborts(host):
    _, dig = read_conf(host, 200)
    with open(_real(host), "ab") as f:
        f.write(b"# edited by someone else\n")
    edited = open(_real(host), "rb").read()
    with pytest.raises(GpuboxError, match="changed since it was checked"):
        write_conf(host, 200, NEW, dig)
    assert open(_real(host), "rb").read() == edited and _leftovers(host) == []


def test_change_between_tmp_write_and_rename_is_caught(host, monkeypatch):
    """The file is re-read under the lock just before rename(); an edit after the first look aborts."""
    real_check = lxcconf._refuse_if_changed_or_locked
    calls = []

    def check_then_someone_edits(h, path, old, expect):
        real_check(h, path, old, expect)
        calls.append(1)
        if len(calls) == 1:  # after the first look, before the rename
            with open(_real(host), "ab") as f:
                f.write(b"memory: 1024\n")

    monkeypatch.setattr(lxcconf, "_refuse_if_changed_or_locked", check_then_someone_edits)
    with pytest.raises(GpuboxError, match="changed since"):
        write_conf(host, 200, NEW, digest(OLD))
    assert open(_real(host), "rb").read() == OLD + b"memory: 1024\n"
    assert _leftovers(host) == []


def test_locked_config_is_refused(host):
    locked = OLD.replace(b"hostname: llm\n", b"hostname: llm\nlock: backup\n")
    with open(_real(host), "wb") as f:
        f.write(locked)
    with pytest.raises(GpuboxError, match=r"locked \(backup\)"):
        write_conf(host, 200, NEW, digest(locked))
    assert open(_real(host), "rb").read() == locked


def test_proxmox_lock_file_held_elsewhere_times_out(host):
    lk_path = host.path("/run/lock/lxc/pve-config-200.lock")
    os.makedirs(os.path.dirname(lk_path), exist_ok=True)
    with open(lk_path, "a") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        with pytest.raises(GpuboxError, match="held by another process"):
            write_conf(host, 200, NEW, digest(OLD), lock_timeout=0.3)
    assert open(_real(host), "rb").read() == OLD


def test_over_one_mib_is_refused(host):
    with pytest.raises(GpuboxError, match="1 MiB"):
        write_conf(host, 200, "arch: amd64\n" + "#" + "x" * (1024 * 1024) + "\n", digest(OLD))
    assert open(_real(host), "rb").read() == OLD


def _crash_before_rename(root, old_digest):
    from gpubox.inventory import HostEntry

    lxcconf._rename = lambda ops, src, dst: os._exit(9)  # the process dies at the commit point
    h = Host(HostEntry("pve1", {"gpubox_root": root}), LocalTransport("pve1"))
    write_conf(h, 200, NEW, old_digest)


def test_crash_between_tmp_write_and_rename_leaves_the_original(host):
    p = multiprocessing.get_context("fork").Process(
        target=_crash_before_rename, args=(host.root, digest(OLD))
    )
    p.start()
    p.join(30)
    assert p.exitcode == 9
    assert open(_real(host), "rb").read() == OLD  # old file, whole
    left = _leftovers(host)
    assert len(left) == 1 and left[0].startswith("200.conf.tmp.")  # Proxmox's own tmp naming
    assert open(os.path.join(os.path.dirname(_real(host)), left[0])).read() == NEW  # complete new copy


class _RemoteLike(LocalTransport):
    """Local processes, but treated as remote: exercises the flock + sha1sum + mv commit path."""

    @property
    def is_local(self):
        return False


def _remote_host(host):
    return Host(host.entry, _RemoteLike("pve1"))


def test_remote_commit_path_with_real_flock_sha1sum_mv(host):
    h = _remote_host(host)
    write_conf(h, 200, NEW, digest(OLD))
    assert open(_real(host)).read() == NEW and _leftovers(host) == []
    assert stat.S_IMODE(os.stat(_real(host)).st_mode) == 0o640


def test_remote_commit_path_aborts_on_changed_digest(host, monkeypatch):
    h = _remote_host(host)
    real_check = lxcconf._refuse_if_changed_or_locked

    def then_edit(hh, path, old, expect):
        real_check(hh, path, old, expect)
        with open(_real(host), "ab") as f:
            f.write(b"cores: 2\n")

    monkeypatch.setattr(lxcconf, "_refuse_if_changed_or_locked", then_edit)
    with pytest.raises(GpuboxError, match="changed since"):
        write_conf(h, 200, NEW, digest(OLD))
    assert open(_real(host), "rb").read() == OLD + b"cores: 2\n" and _leftovers(host) == []


def test_a_read_only_file_on_a_plain_directory_is_not_taken_for_no_quorum(host):
    """Only pmxcfs's own look (root:www-data, 0440) names the missing quorum; root writes a 0440
    file elsewhere (tests/test_lxc_pmxcfs.py has the pmxcfs side)."""
    os.chmod(_real(host), 0o440)
    write_conf(host, 200, NEW, digest(OLD))
    assert open(_real(host)).read() == NEW
