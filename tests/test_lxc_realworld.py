"""Real container configs from public sources (tests/fixtures/lxc/realworld/*.conf, provenance in
*.source): parse as Proxmox does, fix in one run, every NVIDIA node present and permitted, every
non-NVIDIA line byte-identical, the container would start, the second run changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubox.provision.confedit import _is_nvidia_path, decide
from gpubox.provision.devices import read_host_devices
from gpubox.provision.lxcconf import LxcConf
from gpubox.provision.lxcmodel import DYNAMIC_MAJORS, StartModel, devn_path, host_rdev_under, parse_rule
from gpubox.simbox.cmds import pct
from gpubox.simbox.lxc import mknod
from tests.lxc_corpus import STOCK_NODES
from tests.lxc_fakehost import fake_host

REAL = Path(__file__).parent / "fixtures" / "lxc" / "realworld"
CONFS = sorted(REAL.glob("*.conf"))


def test_corpus_has_twenty_real_configs_each_with_provenance():
    assert len(CONFS) >= 20
    for c in CONFS:
        src = c.with_suffix(".source")
        assert src.exists() and src.read_text().strip(), f"{c.name} has no provenance note"


@pytest.fixture
def host(tmp_path):
    h = fake_host(tmp_path / "pve1")
    for p, (ma, mi) in STOCK_NODES.items():
        mknod(tmp_path / "pve1" / p.lstrip("/"), ma, mi)
    from tests.lxc_corpus import HOST_INCLUDES

    for f in HOST_INCLUDES:  # the host's own include files the configs name (lxc.include)
        (tmp_path / "pve1" / f.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pve1" / f.lstrip("/")).write_text("# stand-in\n")
    return h


def _nv_line(key, value, hd) -> bool:
    nv_now = set(hd.nvidia_majors().values())
    if key.startswith("lxc.cgroup"):
        r = parse_rule(key, value)
        major = r.major if r and not r.is_global else None
        stale_dyn = major in DYNAMIC_MAJORS and not hd.registered(major)
        return major is not None and (major in nv_now or stale_dyn)
    if key == "lxc.mount.entry":
        f = value.split()
        return _is_nvidia_path(f[0]) or f[1].strip("/").startswith("dev/nvidia")
    if key.startswith("dev") and key[3:].isdigit():
        return _is_nvidia_path(devn_path(value))
    return False


def _main_pairs(text: str):
    conf = LxcConf.parse(text)
    return [(l.key, l.value) for l in conf.main.lines if l.key]


@pytest.mark.parametrize("path", CONFS, ids=lambda p: p.stem)
def test_real_config(path, host):
    raw = path.read_bytes().decode()
    conf = LxcConf.parse(raw)
    assert conf.render() == raw  # byte-exact round trip
    # parse equals Proxmox's (the simulator's parse_pct_config, written from Config.pm)
    pve = pct.parse_config(raw, 200)
    ours = [[k, v] for k, v in _main_pairs(raw) if k.startswith("lxc.")]
    assert [list(p) for p in pve.get("lxc", [])] == ours
    assert sorted(pve["snapshots"]) == sorted(conf.snapshots)
    hd = read_host_devices(host, 2)
    rdev = host_rdev_under(host.path("/"))
    rev = decide(conf, hd, None, rdev)
    assert not [i for i in rev.issues if not i.fixable], rev.issues
    new = rev.new
    # every non-NVIDIA line unchanged, in order; other sections byte-identical
    keep = [
        l.raw.rstrip("\r\n") for l in conf.main.lines if not (l.key and _nv_line(l.key, l.value or "", hd))
    ]
    got = [
        l.raw.rstrip("\r\n")
        for l in LxcConf.parse(new).main.lines
        if not (l.key and _nv_line(l.key, l.value or "", hd))
    ]
    assert got == keep
    assert [s.render() for s in LxcConf.parse(new).sections[1:]] == [s.render() for s in conf.sections[1:]]
    if "\r\n" in raw:
        assert new.count("\n") == new.count("\r\n")
    # would start; every NVIDIA node present and permitted
    entries = [(i, l.key, l.value or "") for i, l in enumerate(LxcConf.parse(new).main.lines) if l.key]
    model = StartModel.build(entries, rdev)
    assert model.errors == []
    for n in hd.pass_nodes():
        if not n.required and any(w.startswith(f"{n.path} is left out") for w in rev.warnings):
            assert not model.providers(n.path)  # an optional node no boot creates: not made a devN entry
            continue
        assert model.providers(n.path), f"{n.path} absent"
        devn = any(p == n.path for _, _, p in model.devn)
        assert devn or model.permitted(*n.want), f"{n.path} denied"
        assert not (devn and any(k == "mount" for k, _ in model.providers(n.path))), f"{n.path} passed twice"
    # second run: nothing to do
    again = decide(LxcConf.parse(new), hd, None, rdev)
    assert again.new == new and [i for i in again.issues if i.fixable] == []


def test_foreign_stale_rules_and_allow_all_stay(host):
    hd = read_host_devices(host, 2)
    rdev = host_rdev_under(host.path("/"))
    text = (REAL / "frigate_8652_dirmounts_coral.conf").read_text()
    rev = decide(LxcConf.parse(text), hd, None, rdev)
    assert "lxc.cgroup2.devices.allow: c 120:0 rwm\n" in rev.new and "c 120:1 rwm" in rev.new
    # the directory-bound nvidia0/1 are not bound a second time
    assert rev.new.count("dev/nvidia0 ") == 1
    a = (REAL / "russian_ollama_508_allow_a.conf").read_text()
    rev = decide(LxcConf.parse(a), hd, None, rdev)
    # under `a` the uvm mount needs no rule, so it vouches for nothing: the stale 508 stays and is
    # reported (a second run would otherwise drop what the first kept, see test_lxcconf_fuzz)
    assert (
        "lxc.cgroup2.devices.allow: a\n" in rev.new and "lxc.cgroup2.devices.allow: c 508:* rwm\n" in rev.new
    )
    assert any("major 508" in w and "left as it is" in w for w in rev.warnings)
    assert any("every device" in w for w in rev.warnings)


def test_rule_syntax_follows_lxc():
    assert parse_rule("lxc.cgroup2.devices.allow", "c 195:* rwm # nvidia").access == "rwm"
    assert parse_rule("lxc.cgroup2.devices.allow", "c  195:* rwm") is None
    assert parse_rule("lxc.cgroup2.devices.allow", "c 195:* rw # x") is None
    assert parse_rule("lxc.cgroup2.devices.allow", "a").is_global


def test_devn_plus_mount_is_a_start_failure_and_fix_drops_the_mount(host):
    hd = read_host_devices(host, 2)
    rdev = host_rdev_under(host.path("/"))
    text = (
        "arch: amd64\ndev0: /dev/nvidia0,mode=0666\n"
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
    )
    conf = LxcConf.parse(text)
    entries = [(i, l.key, l.value) for i, l in enumerate(conf.main.lines) if l.key]
    errs = StartModel.build(entries, rdev).errors
    assert errs == ["Could not mknod /usr/lib/x86_64-linux-gnu/lxc/rootfs/dev/nvidia0: File exists"]
    rev = decide(conf, hd, None, rdev)
    assert "lxc.mount.entry: /dev/nvidia0" not in rev.new and "dev0: /dev/nvidia0,mode=0666" in rev.new
    assert any(i.kind == "collision" for i in rev.issues)


def test_foreign_unparsable_rule_is_reported_untouched(host):
    """lxc skips a rule it cannot parse and starts (the real kernel: corpus matrix/two_spaces)."""
    hd = read_host_devices(host, 2)
    text = "arch: amd64\nlxc.cgroup2.devices.allow: c  120:0 rwm\n"
    rev = decide(LxcConf.parse(text), hd, None, host_rdev_under(host.path("/")))
    assert not [i for i in rev.issues if not i.fixable] and "c  120:0 rwm" in rev.new
    assert any("cannot parse" in w and "skips it" in w for w in rev.warnings)
    assert os.path.exists(host.path("/dev/nvidia0"))


def test_two_mounts_onto_one_target_keep_the_one_whose_source_is_the_hosts_node(host):
    """A real role's README binds nvidia-modeset twice, relative source first: the relative one
    goes (lxc does not read it on the host; its `optional,create=file` leaves an empty regular
    file), the absolute one stays, whatever the order."""
    hd = read_host_devices(host, 2)
    rdev = host_rdev_under(host.path("/"))
    text = (REAL / "simoncaron_role_relative_modeset_dup.conf").read_text()
    rel = "lxc.mount.entry: dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file\n"
    absolute = "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file\n"
    swapped = text.replace(rel, "@@").replace(absolute, rel).replace("@@", absolute)
    for t in (text, swapped):
        rev = decide(LxcConf.parse(t), hd, None, rdev)
        assert absolute in rev.new and rel not in rev.new, rev.new
        assert any(
            i.kind == "conflict" and "dev/nvidia-modeset dev/nvidia-modeset" in i.text for i in rev.issues
        )
