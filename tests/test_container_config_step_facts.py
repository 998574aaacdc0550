"""The container-config step decides from gathered facts, not from live stat() calls: the host
paths it gathers (provision.lxc.referenced_paths) must be every path the start model asks about,
so the decision from facts equals decide() with a live stat of the host, on every real config."""

from __future__ import annotations

import pytest

from gpubox.provision.confedit import decide
from gpubox.provision.container_config_step import (
    ConfigFacts,
    ConfigOptions,
    ContainerConfigStep,
    config_commit,
)
from gpubox.provision.devices import DeviceScanFact, host_devices
from gpubox.provision.lxc import HostRdev, referenced_paths
from gpubox.provision.lxcconf import LxcConf
from gpubox.provision.lxcmodel import host_rdev_under
from gpubox.simbox.lxc import mknod
from tests.lxc_fakehost import FIXTURES, fake_host

CONFS = sorted((FIXTURES / "realworld").glob("*.conf")) + sorted(
    p for p in FIXTURES.glob("*.conf") if not p.name.endswith(".expected.conf")
)
OTHER = {
    "/dev/dri/card0": (226, 0),
    "/dev/dri/renderD128": (226, 128),
    "/dev/net/tun": (10, 200),
    "/dev/apex_0": (120, 0),
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    root = tmp_path_factory.mktemp("pve1")
    h = fake_host(root)
    for p, (ma, mi) in OTHER.items():
        mknod(root / p.lstrip("/"), ma, mi)
    return h


@pytest.mark.parametrize("path", CONFS, ids=lambda p: p.stem)
@pytest.mark.parametrize("mode", [None, "devN"])
def test_decision_from_facts_equals_live_review(path, mode, host):
    text = path.read_text()
    scan = DeviceScanFact.read(host, 2)
    hd = host_devices(scan)
    facts = ConfigFacts(text, scan, HostRdev.read(host, tuple(referenced_paths(text, hd))), [])
    f = ContainerConfigStep().decide(facts, ConfigOptions(200, mode, "ct200"))
    live = decide(LxcConf.parse(text), hd, mode, host_rdev_under(host.path("/")))
    if LxcConf.parse(text).lock:
        assert f.status == "failed" and "locked" in f.detail
        return
    assert [(i["kind"], i["text"]) for i in f.evidence.issues] == [(i.kind, i.text) for i in live.issues]
    assert f.evidence.warnings == live.warnings
    if f.status == "failed":  # refused: nothing is written, whatever review would edit
        assert any(not i.fixable for i in live.issues)
        return
    commit = config_commit(f.plan)
    got = commit.text if commit is not None else text
    assert got == live.new


def test_a_path_the_facts_lack_is_an_error_not_absent(host):
    text = "arch: amd64\ndev0: /dev/dri/card0\n"
    scan = DeviceScanFact.read(host, 2)
    rdev = HostRdev.read(host, tuple(referenced_paths(text, host_devices(scan))))
    del rdev["/dev/dri/card0"]
    with pytest.raises(KeyError):
        ContainerConfigStep().decide(ConfigFacts(text, scan, rdev, []), ConfigOptions(200, None, "ct200"))


def test_restart_due_mark_is_set_by_a_config_write_and_cleared_by_a_start(tmp_path, monkeypatch):
    from gpubox.provision.lxc import OwnedRecord, clear_restart_due, record_majors, recorded_majors

    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))

    class H:
        name = "pve1"

    def due():
        return OwnedRecord.parse(OwnedRecord.read(H, 200), 200).restart_due

    record_majors("pve1", 200, [195, 511])
    assert not due()
    record_majors("pve1", 200, [235], restart_due="abc")
    assert due() and recorded_majors("pve1", 200) == {195, 235, 511}
    clear_restart_due("pve1", 200)
    assert not due() and recorded_majors("pve1", 200) == {195, 235, 511}
