"""CDI specs inside the container (provision.cdi): which entries pin an NVIDIA node to a stale
major, which spec the runtime uses, and how the files are read (bounded, /var/run through /run)."""

import os

import pytest

from gpubox.host import Host
from gpubox.inventory import HostEntry
from gpubox.provision.cdi import CdiFacts, CdiSpec, node_driver, read_facts, stale_nodes
from gpubox.transport.local import LocalTransport

PROC = "Character devices:\n195 nvidia\n195 nvidiactl\n508 nvidia-caps\n509 nvidia-uvm\n\nBlock devices:\n  8 sd\n"


def spec(uvm: int, caps: int = 508, kind: str = "nvidia.com/gpu") -> str:
    return (
        f"cdiVersion: 0.5.0\nkind: {kind}\ncontainerEdits:\n  deviceNodes:\n"
        f"  - path: /dev/nvidia-uvm\n    major: {uvm}\n    minor: 0\n"
        f"  - path: /dev/nvidia-caps/nvidia-cap1\n    major: {caps}\n    minor: 1\n"
        "  - path: /dev/nvidiactl\n    major: 195\n    minor: 255\n"
    )


@pytest.mark.parametrize(
    "path, want",
    [
        ("/dev/nvidia-uvm", "nvidia-uvm"),
        ("/dev/nvidia-uvm-tools", "nvidia-uvm"),
        ("/dev/nvidia-caps/nvidia-cap2", "nvidia-caps"),
        ("/dev/nvidia3", "nvidia"),
        ("/dev/nvidiactl", "nvidia"),
        ("/dev/nvidia-modeset", "nvidia"),
        ("/dev/dri/renderD128", None),
        ("/dev/nvidia-caps-imex-channels/channel0", None),
    ],
)
def test_node_driver(path, want):
    assert node_driver(path) == want


@pytest.mark.parametrize(
    "specs, stale",
    [
        ([("/etc/cdi/nvidia.yaml", spec(509))], []),
        ([("/etc/cdi/nvidia.yaml", spec(510))], ["/etc/cdi/nvidia.yaml: /dev/nvidia-uvm major 510"]),
        ([("/etc/cdi/nvidia.yaml", spec(509, caps=235))], ["nvidia-cap1 major 235, the driver's is 508"]),
        # a JSON spec is read the same way
        (
            [
                (
                    "/etc/cdi/nvidia.json",
                    '{"kind": "nvidia.com/gpu", "containerEdits": {"deviceNodes": '
                    '[{"path": "/dev/nvidia-uvm", "major": 511}]}}',
                )
            ],
            ["nvidia.json: /dev/nvidia-uvm major 511"],
        ),
        # the later directory wins for a kind; another kind in /etc/cdi still counts
        ([("/etc/cdi/nvidia.yaml", spec(510)), ("/run/cdi/nvidia.yaml", spec(509))], []),
        (
            [("/etc/cdi/a.yaml", spec(510, kind="example.com/x")), ("/run/cdi/nvidia.yaml", spec(509))],
            ["/etc/cdi/a.yaml"],
        ),
        # no major given: the runtime stats the host node, nothing is pinned
        (
            [
                (
                    "/etc/cdi/nvidia.yaml",
                    "kind: nvidia.com/gpu\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidia-uvm\n",
                )
            ],
            [],
        ),
        ([("/etc/cdi/broken.yaml", "kind: [\n")], []),
    ],
)
def test_stale_nodes(specs, stale):
    got = stale_nodes(CdiFacts([CdiSpec(p, t) for p, t in specs], PROC))
    assert len(got) == len(stale) and all(w in g for w, g in zip(stale, got)), got


def test_nothing_is_judged_without_an_nvidia_driver():
    assert stale_nodes(CdiFacts([CdiSpec("/etc/cdi/nvidia.yaml", spec(510))], "Character devices:\n")) == []


def test_read_facts_reads_both_directories_and_var_run_through_run(tmp_path):
    (tmp_path / "etc/cdi").mkdir(parents=True)
    (tmp_path / "run/cdi").mkdir(parents=True)
    (tmp_path / "var").mkdir()
    os.symlink("../run", tmp_path / "var/run")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text(PROC)
    (tmp_path / "etc/cdi/nvidia.yaml").write_text(spec(510))
    (tmp_path / "etc/cdi/notes.txt").write_text("not a spec")
    (tmp_path / "run/cdi/nvidia.yaml").write_text(spec(509))
    os.mkfifo(tmp_path / "etc/cdi/fifo.yaml")  # refused without blocking, named as unreadable
    host = Host(HostEntry("ct", {"gpubox_root": str(tmp_path)}), LocalTransport("ct"))
    f = read_facts(host)
    assert [s.path for s in f.specs] == ["/etc/cdi/fifo.yaml", "/etc/cdi/nvidia.yaml", "/run/cdi/nvidia.yaml"]
    assert f.specs[0].text is None and f.specs[0].error
    assert f.proc_devices == PROC and stale_nodes(f) == []
