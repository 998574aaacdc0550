"""driver-packages and kernel-log (issue 38): the pure readers of dpkg's database, apt's history and
the kernel log, and the two steps on a simulated host (its journalctl stand-in, its dpkg database)."""

from __future__ import annotations

import pytest

from gpubox.provision import kmsg, pkgdrift

STATUS = """Package: nvidia-driver-550
Status: hold ok installed
Version: 550.127.05-0ubuntu1

Package: libnvidia-compute-550
Status: install ok installed
Architecture: amd64
Version: 550.127.05-0ubuntu1
Description: NVIDIA libcompute package
 Package: not-a-field

Package: nvidia-fabricmanager-550
Status: install ok installed
Version: 550.127.05-1

Package: nvidia-settings
Status: install ok installed
Version: 510.47.03-0ubuntu1

Package: libnvidia-gl-550
Status: deinstall ok config-files
Version: 550.54.15-0ubuntu1

Package: pciutils
Status: install ok installed
Version: 1:3.13.0-2
"""


def test_parse_status_keeps_installed_driver_and_fabric_packages():
    got = pkgdrift.parse_status(STATUS)
    assert [(p.name, p.version, p.held) for p in got] == [
        ("libnvidia-compute-550", "550.127.05-0ubuntu1", False),
        ("nvidia-driver-550", "550.127.05-0ubuntu1", True),
        ("nvidia-fabricmanager-550", "550.127.05-1", False),
    ]


@pytest.mark.parametrize(
    "version, want",
    [
        ("550.127.05-0ubuntu1", "550.127.05"),
        ("1:535.216.01-1~deb12u1", "535.216.01"),
        ("470.82.01-1", "470.82.01"),
    ],
)
def test_upstream(version, want):
    assert pkgdrift.upstream(version) == want


@pytest.mark.parametrize(
    "sysv, procv, want",
    [
        ("550.127.05\n", "", "550.127.05"),
        (
            "",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build",
            "580.95.05",
        ),
        (
            "",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  460.73.01  Thu Apr  1 21:40:36 UTC 2021",
            "460.73.01",
        ),
        ("", "", None),
    ],
)
def test_module_version(sysv, procv, want):
    assert pkgdrift.module_version(sysv, procv) == want


@pytest.mark.parametrize(
    "module, status, words",
    [
        (
            "550.127.05",
            "ok",
            ["3 NVIDIA package(s) at the loaded driver 550.127.05", "not held: libnvidia-compute-550"],
        ),
        (
            "550.120",
            "failed",
            ["the loaded driver is 550.120", "nvidia-fabricmanager-550 550.127.05-1", "CUDA 802"],
        ),
    ],
)
def test_packages_against_the_loaded_driver(module, status, words):
    f = pkgdrift.PkgFacts(module, pkgdrift.parse_status(STATUS), "")
    st, detail, cause, repair = pkgdrift.decide(f)
    assert st == status
    text = " ".join(filter(None, [detail, cause, repair]))
    for w in words:
        assert w in text, (w, text)
    if status == "failed":
        assert "apt-mark hold libnvidia-compute-550 nvidia-driver-550 nvidia-fabricmanager-550" in repair


def test_no_dpkg_and_no_packages_are_not_alarms():
    assert pkgdrift.decide(pkgdrift.PkgFacts("550.120", None))[0] == "skipped"
    assert pkgdrift.decide(pkgdrift.PkgFacts("550.120", []))[0] == "ok"


T = "2026-12-01T11:00:00+0000 pve1 kernel:"
LOG = (
    f"{T} NVRM: Xid (PCI:0000:17:00): 13, Graphics SM Warp Exception\n"
    f"{T} NVRM: Xid (PCI:0000:17:00): 13, Graphics SM Warp Exception\n"
    f"{T} NVRM: Xid (PCI:0000:3d:00): 94, pid=1234, name=python3, Contained ECC error\n"
    f"{T} nvidia 0000:3d:00.0: AER: PCIe Bus Error: severity=Correctable, type=Physical Layer, (Receiver ID)\n"
    f"{T} EDAC MC0: 3 CE memory read error on CPU_SrcID#0_Ha#0\n"
)


def test_summarize_counts_xids_per_gpu_and_corrected_errors():
    s = kmsg.summarize({"this boot": LOG})
    assert [(x.bus, x.xid, x.count) for x in s.xids] == [("0000:17:00", 13, 2), ("0000:3d:00", 94, 1)]
    assert s.corrected == {"0000:3d:00.0": 1} and s.edac_ce == 3


@pytest.mark.parametrize(
    "text, status, words",
    [
        (
            LOG,
            "failed",
            ["Xid 94 x1 on 0000:3d:00 (contained ECC error", "GPU memory errors", "nvidia-smi -r"],
        ),
        (
            LOG.splitlines()[0] + "\n",
            "ok",
            ["no hardware Xid", "Xid 13 x1 on 0000:17:00 (graphics engine exception"],
        ),
        ("", "ok", ["no hardware Xid in the kernel log (this boot)"]),
    ],
)
def test_kernel_log_decision(text, status, words):
    st, detail, cause, repair = kmsg.decide(kmsg.KmsgFacts({"this boot": text}))
    assert st == status
    for w in words:
        assert w in " ".join(filter(None, [detail, cause, repair])), (w, detail)


def test_an_unread_log_is_skipped():
    assert kmsg.decide(kmsg.KmsgFacts(None))[0] == "skipped"


def test_the_simulated_host_logs_a_lost_gpu_and_has_no_driver_package(tmp_path):
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.pipeline import run_steps
    from gpubox.provision.driver_packages_step import DriverPackagesStep
    from gpubox.provision.kernel_log_step import KernelLogStep
    from gpubox.simbox import build

    sim = build(tmp_path / "box", ["gpu_lost"], gpus=2)
    inv = Inventory(sim.inventory_path)
    rep = run_steps(
        Context(box=inv.box("ct200"), inventory=inv), [DriverPackagesStep(), KernelLogStep()], "check"
    )
    st = {s.name: s for s in rep.steps}
    assert st["driver-packages"].status == "ok" and "no NVIDIA driver" in st["driver-packages"].detail
    assert st["kernel-log"].status == "failed"
    assert "0000:3d:00 fell off the bus, found at the driver's probe" in st["kernel-log"].detail
    assert [c["argv"][-2:] for c in sim.calls("journalctl")] == [["-b", "0"], ["-b", "-1"]]
