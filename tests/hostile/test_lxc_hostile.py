"""Hostile but fair inputs for the container-config write and repair (issue 16 items 5 and 11,
issue 15): symlinked configs, unlocked edits racing the commit, CRLF files, other devices' rules."""

from __future__ import annotations

import os

import pytest

from gpubox.errors import GpuboxError
from gpubox.provision import lxcconf
from gpubox.provision.confedit import decide
from gpubox.provision.devices import read_host_devices
from gpubox.provision.lxcconf import LxcConf, conf_path, digest, read_conf, write_conf
from gpubox.provision.lxcmodel import StartModel, host_rdev_under
from tests.lxc_fakehost import STALE_NEW, STALE_OLD, host_with_stale_conf

OLD, NEW = STALE_OLD, STALE_NEW


@pytest.fixture
def host(tmp_path):
    return host_with_stale_conf(tmp_path / "pve1")


def _real(h):
    return h.path(conf_path(200))


def _leftovers(h):
    return sorted(n for n in os.listdir(os.path.dirname(_real(h))) if n != "200.conf")


# -- (5) a symlinked config is refused, never replaced by a regular file ---------------------------


@pytest.mark.parametrize("target", ["abs", "rel", "dangling"])
def test_symlinked_config_is_refused_and_left_alone(host, tmp_path, target):
    elsewhere = tmp_path / "elsewhere.conf"
    elsewhere.write_bytes(OLD)
    os.unlink(_real(host))
    dest = {
        "abs": str(elsewhere),
        "rel": os.path.relpath(elsewhere, os.path.dirname(_real(host))),
        "dangling": str(tmp_path / "gone.conf"),
    }[target]
    os.symlink(dest, _real(host))
    with pytest.raises(GpuboxError, match="symbolic link") as ei:
        write_conf(host, 200, NEW, digest(OLD))
    assert "no symlinks" in ei.value.fix
    assert os.path.islink(_real(host)) and os.readlink(_real(host)) == dest
    assert elsewhere.read_bytes() == OLD
    assert [n for n in _leftovers(host) if ".tmp." in n] == []


# -- (11) an unlocked edit racing the commit is never lost ----------------------------------------


@pytest.mark.parametrize("how", ["append-in-place", "replace-by-rename"])
def test_edit_after_the_last_reread_is_kept_and_ours_refused(host, monkeypatch, how):
    real_check = lxcconf._refuse_if_changed_or_locked
    calls = []

    def check_then_race(h, path, data, expect):
        real_check(h, path, data, expect)
        calls.append(1)
        if len(calls) == 2:  # the last re-read passed; another writer strikes before the commit
            if how == "append-in-place":
                with open(_real(host), "ab") as f:
                    f.write(b"memory: 1024\n")
            else:
                other = _real(host) + ".other"
                with open(other, "wb") as f:
                    f.write(OLD + b"memory: 1024\n")
                os.replace(other, _real(host))

    monkeypatch.setattr(lxcconf, "_refuse_if_changed_or_locked", check_then_race)
    with pytest.raises(GpuboxError, match="changed while it was being replaced"):
        write_conf(host, 200, NEW, digest(OLD))
    assert open(_real(host), "rb").read() == OLD + b"memory: 1024\n"
    assert _leftovers(host) == []


def test_without_exchange_support_the_plain_rename_still_commits(host, monkeypatch):
    # e.g. a FUSE mount without RENAME_EXCHANGE (pmxcfs: tests/test_lxc_pmxcfs.py)
    monkeypatch.setattr(host.transport.ops, "exchange", lambda a, b: False)
    write_conf(host, 200, NEW, digest(OLD))
    assert open(_real(host)).read() == NEW and _leftovers(host) == []


def test_exchange_is_atomic_swap(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("A")
    b.write_text("B")
    from gpubox.transport.fsops import POSIX

    assert POSIX.exchange(str(a), str(b))
    assert (a.read_text(), b.read_text()) == ("B", "A")


# -- CRLF files keep CRLF, also on replaced lines --------------------------------------------------


def test_crlf_file_keeps_crlf_on_replaced_and_new_lines(host):
    crlf = OLD.replace(b"\n", b"\r\n")
    with open(_real(host), "wb") as f:
        f.write(crlf)
    conf, dig = read_conf(host, 200)
    rev = decide(conf, read_host_devices(host, 2))
    assert rev.changed and any(i.kind == "stale-rule" for i in rev.issues)
    write_conf(host, 200, rev.new, dig)
    data = open(_real(host), "rb").read()
    assert data.count(b"\n") == data.count(b"\r\n") and b"c 511:* rwm\r\n" in data
    again = decide(read_conf(host, 200)[0], read_host_devices(host, 2))
    assert not again.changed


# -- other devices' rules stay byte-identical -----------------------------------------------------

FOREIGN = [
    "lxc.cgroup2.devices.allow: c 120:0 rwm",  # Coral PCIe, driver not loaded yet
    "lxc.cgroup2.devices.allow: c 120:* rwm",
    "lxc.cgroup2.devices.allow: c 188:* rwm",  # USB serial, dongle unplugged
    "lxc.cgroup2.devices.allow: c 166:* rwm",  # ttyACM
    "lxc.cgroup2.devices.allow: c 10:200 rwm",  # tun
    "lxc.cgroup2.devices.allow: c 10:232 rwm",  # kvm
    "lxc.cgroup2.devices.allow: c 226:* rwm",  # DRI
    "lxc.cgroup2.devices.allow: a",
    "lxc.cgroup2.devices.allow: c 189:* rwm # usb",
    "lxc.cgroup2.devices.deny: c 188:0 rwm",
    "lxc.cgroup.devices.allow: c 10:200 rwm",  # v1: reported, not converted (not ours)
    "lxc.mount.entry: /dev/bus/usb dev/bus/usb none bind,optional,create=dir",
    "lxc.mount.entry: /dev/dri dev/dri none bind,optional,create=dir",
    "dev0: /dev/dri/renderD128,gid=104",
]


@pytest.mark.parametrize("line", FOREIGN)
def test_foreign_line_stays_byte_identical_and_fix_converges(host, line):
    for p, (ma, mi) in {"dev/dri/renderD128": (226, 128)}.items():
        from gpubox.simbox.lxc import mknod

        mknod(host.path("/" + p), ma, mi)
    text = OLD.decode().replace(
        "lxc.cgroup2.devices.allow: b 7:* rwm\n", f"lxc.cgroup2.devices.allow: b 7:* rwm\n{line}\n"
    )
    assert line in text
    hd = read_host_devices(host, 2)
    rdev = host_rdev_under(host.path("/"))
    rev = decide(LxcConf.parse(text), hd, None, rdev)
    assert f"\n{line}\n" in rev.new
    again = decide(LxcConf.parse(rev.new), hd, None, rdev)
    assert again.new == rev.new
    lines = LxcConf.parse(rev.new).main.lines
    model = StartModel.build([(i, l.key, l.value or "") for i, l in enumerate(lines) if l.key], rdev)
    assert model.errors == []
    for n in hd.pass_nodes():
        devn = any(p == n.path for *_, p in model.devn)
        assert model.providers(n.path) and (model.permitted(*n.want) or devn)


def test_stale_dynamic_rule_without_nvidia_evidence_is_not_ours(host):
    hd = read_host_devices(host, 2)
    text = "arch: amd64\nlxc.cgroup2.devices.allow: c 509:* rwm\n"  # nothing says it was nvidia-uvm
    rev = decide(LxcConf.parse(text), hd, None, host_rdev_under(host.path("/")))
    assert "lxc.cgroup2.devices.allow: c 509:* rwm\n" in rev.new
    assert not any(i.kind == "stale-rule" for i in rev.issues)


@pytest.mark.parametrize(
    "value,ours",
    [("c  511:* rwm", True), ("c 195:*  rwm", True), ("c  120:0 rwm", False), ("c 511:* rw # uvm", True)],
)
def test_rules_lxc_cannot_parse(host, value, ours):
    hd = read_host_devices(host, 2)
    text = f"arch: amd64\nlxc.cgroup2.devices.allow: {value}\n"
    rev = decide(LxcConf.parse(text), hd, None, host_rdev_under(host.path("/")))
    if ours:
        assert value not in rev.new and all(i.fixable for i in rev.issues)
        assert not decide(LxcConf.parse(rev.new), hd, None, host_rdev_under(host.path("/"))).changed
    else:  # lxc skips it and starts (tests/fixtures/lxc/corpus/matrix/two_spaces.json): reported, kept
        assert value in rev.new and any("cannot parse" in w and "skips it" in w for w in rev.warnings)
        assert all(i.fixable for i in rev.issues)


def test_cli_fix_on_a_symlinked_config_fails_with_the_reason(tmp_path, capsys, monkeypatch):
    from gpubox.simbox import build
    from tests.clirun import gpubox

    monkeypatch.setenv("COLUMNS", "400")
    sim = build(tmp_path / "box", {"uvm_stale_major"}, gpus=2)
    conf = sim.hpath("/etc/pve/lxc/200.conf")
    target = tmp_path / "real200.conf"
    os.replace(conf, target)
    os.symlink(target, conf)
    before = target.read_bytes()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--yes")
    assert rc == 1 and "symbolic link" in out + err
    assert os.path.islink(conf) and target.read_bytes() == before


def test_recorded_major_proves_a_stale_rule_is_ours(host, tmp_path, monkeypatch):
    from gpubox.provision.lxc import record_majors, recorded_majors

    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    hd = read_host_devices(host, 2)
    text = "arch: amd64\nlxc.cgroup2.devices.allow: c 509:* rwm\n"
    record_majors("../../../../tmp/x", 200, [195, 509])
    assert recorded_majors("../../../../tmp/x", 200) == {195, 509}
    assert all(p.parent == tmp_path / "state" / "lxc-owned" for p in (tmp_path / "state").rglob("*.json"))
    rev = decide(
        LxcConf.parse(text),
        hd,
        None,
        host_rdev_under(host.path("/")),
        recorded_majors("../../../../tmp/x", 200),
    )
    assert "c 509:* rwm" not in rev.new and any(i.kind == "stale-rule" for i in rev.issues)
