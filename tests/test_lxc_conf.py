"""Golden Proxmox container configs: byte-for-byte round trip and exactly the expected edit."""

from __future__ import annotations

import pytest

from gpubox.errors import GpuboxError
from gpubox.provision.confedit import decide
from gpubox.provision.devices import parse_proc_devices, read_host_devices
from gpubox.provision.lxcconf import LxcConf, digest
from tests.lxc_fakehost import FIXTURES, fake_host

INPUTS = sorted(p for p in FIXTURES.glob("*.conf") if not p.name.endswith(".expected.conf"))
ALL = sorted(FIXTURES.glob("*.conf"))


def _mode(p):
    return "devN" if p.name.startswith("devn") else "cgroup2"


@pytest.fixture
def hd(tmp_path):
    return read_host_devices(fake_host(tmp_path / "pve1"), 2)


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.name)
def test_round_trip_is_byte_for_byte(path):
    data = path.read_bytes()
    assert LxcConf.parse(data.decode()).render().encode() == data


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_golden_edit_and_second_run_changes_nothing(path, hd):
    rev = decide(LxcConf.parse(path.read_text()), hd, _mode(path))
    expected = path.with_name(path.stem + ".expected.conf")
    want = expected.read_text() if expected.exists() else path.read_text()
    assert rev.new == want
    assert rev.changed == expected.exists()
    again = decide(LxcConf.parse(rev.new), hd, _mode(path))
    assert not again.changed and [i for i in again.issues if i.fixable] == []


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_only_the_main_section_is_edited(path, hd):
    old = LxcConf.parse(path.read_text())
    new = LxcConf.parse(decide(old, hd, _mode(path)).new)
    assert [s.render() for s in new.sections[1:]] == [s.render() for s in old.sections[1:]]


def test_stale_major_found_and_replaced_in_place(hd):
    conf = LxcConf.parse((FIXTURES / "pve8_cgroup2_stale.conf").read_text())
    rev = decide(conf, hd)
    kinds = {i.kind for i in rev.issues}
    assert kinds == {"stale-rule", "missing-rule", "missing-mount"}
    stale = next(i for i in rev.issues if i.kind == "stale-rule")
    assert "508" in stale.text and "nvidia-uvm is now 511" in stale.text
    diff = rev.diff("/etc/pve/lxc/200.conf")
    assert "-lxc.cgroup2.devices.allow: c 508:* rwm\n+lxc.cgroup2.devices.allow: c 511:* rwm" in diff
    # the snapshot keeps its (historic) 508 rule; the unrelated block-device rule stays
    assert "lxc.cgroup2.devices.allow: c 508:* rwm" in LxcConf.parse(rev.new).sections[1].render()
    assert "b 7:* rwm" in LxcConf.parse(rev.new).main.render()


def test_uvm_not_loaded_still_names_the_stale_rule(tmp_path):
    host = fake_host(tmp_path / "pve1", uvm=None)
    rev = decide(
        LxcConf.parse((FIXTURES / "pve8_cgroup2_stale.conf").read_text()), read_host_devices(host, 2)
    )
    stale = [i.text for i in rev.issues if i.kind == "stale-rule"]
    assert stale and "not loaded" in stale[0]


def test_sections_pending_snapshots_lock_and_spelling():
    conf = LxcConf.parse((FIXTURES / "pending.conf").read_text())
    assert [s.name for s in conf.sections] == ["main", "pve:pending", "clean"]
    assert conf.pending.values("delete") == ["swap"] and conf.snapshots == ["clean"]
    assert conf.lock is None
    locked = LxcConf.parse("arch: amd64\nlock: backup\n\n[snap]\nlock: rollback\n")
    assert locked.lock == "backup"
    assert LxcConf.parse("arch: amd64\n\n[snap]\nlock: backup\n").lock is None  # only main counts
    eq = LxcConf.parse((FIXTURES / "eq_spelling.conf").read_text())
    assert eq.eq_style() and eq.main.values("lxc.cgroup2.devices.allow") == ["c 195:* rwm"]


def test_v1_lines_converted_and_other_v1_keys_warned(hd):
    rev = decide(LxcConf.parse((FIXTURES / "cgroup_v1.conf").read_text()), hd)
    assert sum(i.kind == "cgroup-v1" for i in rev.issues) == 2
    assert "lxc.cgroup.devices" not in rev.new
    assert any("cpuset" in w for w in rev.warnings)
    assert "lxc.cgroup.cpuset.cpus: 0-7" in rev.new  # not ours to convert


def test_devn_entry_for_a_node_missing_on_the_host_is_reported_not_rewritten(tmp_path):
    host = fake_host(tmp_path / "pve1", uvm_nodes=False)
    conf = LxcConf.parse((FIXTURES / "devn.conf").read_text())
    rev = decide(conf, read_host_devices(host, 2), "devN")
    missing = [i for i in rev.issues if i.kind == "devN-node-missing"]
    assert missing and "/dev/nvidia-uvm " in missing[0].text and not missing[0].fixable
    assert "dev3: /dev/nvidia-uvm,gid=44" in rev.new


def test_unknown_mode_is_bad_input(hd):
    with pytest.raises(GpuboxError, match="cgroup2 or devN"):
        decide(LxcConf.parse("arch: amd64\n"), hd, "cdi")


def test_proc_devices_real_h200_layout():
    # Read off a real GPU machine (docs/facts.md): two names share 195; block majors do not leak in.
    text = (
        "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n238 nvidia-uvm\n239 nvidia-nvswitch\n"
        "240 nvidia-nvlink\n241 nvidia-caps\n242 nvidia-caps-imex-channels\n253 tpm\n\n"
        "Block devices:\n  8 sd\n238 nvidia-uvm-not\n253 device-mapper\n"
    )
    m = parse_proc_devices(text)
    assert m["nvidia"] == 195 and m["nvidiactl"] == 195 and m["nvidia-uvm"] == 238
    assert m["nvidia-caps"] == 241 and m["tpm"] == 253 and "device-mapper" not in m and "sd" not in m


def test_digest_is_sha1_of_the_file():
    assert digest(b"arch: amd64\n") == "151d53297197ce4180a960ae4c28cfd01cac379c"
    assert digest("arch: amd64\n") == digest(b"arch: amd64\n")


def test_devn_path_key_spelling_is_understood(hd):
    # Config.pm $dev_desc: `path` is the default key, so `dev0: path=/dev/nvidia0,gid=44` is the same entry
    from gpubox.provision.confedit import devn_path

    assert devn_path("path=/dev/nvidia0,gid=44") == "/dev/nvidia0" == devn_path("/dev/nvidia0,mode=0666")
    text = (FIXTURES / "devn.conf").read_text().replace("dev0: /dev/nvidia0", "dev0: path=/dev/nvidia0")
    rev = decide(LxcConf.parse(text), hd, "devN")
    assert "no devN entry for /dev/nvidia0" not in [i.text for i in rev.issues]
    assert rev.new.count("/dev/nvidia0") == 1
