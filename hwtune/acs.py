"""PCIe Access Control Services on the bridges above the GPUs: the facts and the decision of the
pcie-acs step (hwtune/pcie_acs_step.py).

ACS P2P Request Redirect / Completion Redirect (ACS Control bits 2 and 3, PCIe Base spec 7.7.8;
linux include/uapi/linux/pci_regs.h PCI_ACS_RR, PCI_ACS_CR) make a switch downstream port or a
root port send peer-to-peer requests up to the root complex instead of straight to the peer. For
GPUs that means P2P through the root complex (and through the IOMMU when it translates DMA):
slow tensor parallelism, or NCCL hangs (NCCL docs, Troubleshooting: "PCI Access Control
Services (ACS)"; NVIDIA/nccl#2079: AMD root ports at ACSCtl 0x001d with the IOMMU on, NCCL hung
until ACS was cleared; NVIDIA/nccl#304: PLX ports ReqRedir+ CmpltRedir+).

Judged where it matters: a switch downstream port that redirects while another GPU sits behind
a sibling port of the same switch; a root port that redirects while the IOMMU translates the
GPU's DMA (iommu_group type DMA / DMA-FQ, linux Documentation/ABI/testing/sysfs-kernel-iommu_groups).
A redirect above a GPU with no peer on the same switch, or with the IOMMU off / in passthrough,
is reported in the detail only.

Repair is refused, with the reason: clearing ACS removes the isolation IOMMU groups (and VFIO
passthrough on a Proxmox host) rely on, and nothing measured here says it helps this box; the
operator's options are the BIOS setting or the mainline `pci=disable_acs_redir=` parameter.
ACS is read with the real setpci (`ECAP_ACS+6.w`), like MaxReadReq.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpubox.facts import Fact
from gpubox.steps import OMIT, Finding, Omit

from .pcie import BRIDGE_CLASS, NVIDIA_VENDOR, PciFunctions, setpci_base

RR, CR = 0x04, 0x08  # ACS Control: P2P Request Redirect, P2P Completion Redirect
ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl", "DirectTrans")
PORT_ROOT, PORT_DOWNSTREAM = 4, 6  # PCIe capability Device/Port Type
TRANSLATING = ("DMA", "DMA-FQ")


@dataclass
class Bridge:
    bdf: str
    secondary: int
    subordinate: int
    port_type: int | None = None
    acsctl: int | None = None  # None: no ACS capability


@dataclass
class AcsFacts:
    gpus: list[str] = field(default_factory=list)  # GPU bus ids
    bridges: list[Bridge] = field(default_factory=list)  # bridges whose bus range holds a GPU
    iommu: dict[str, str] = field(default_factory=dict)  # GPU bus id -> iommu_group type ("" none)


@dataclass
class AcsOptions:
    """Nothing to choose: gpubox only reads ACS."""


@dataclass
class AcsEvidence:
    bridges: list[dict[str, Any]]  # bdf, port_type, acsctl, gpus below it
    iommu: dict[str, str]  # GPU bus id -> IOMMU domain type
    redirecting: list[str] | Omit = OMIT  # bridges whose redirect hurts GPU peers


def decode(ctl: int) -> str:
    """lspci's ACSCtl notation: 'SrcValid+ TransBlk- ReqRedir+ ...'."""
    return " ".join(f"{n}{'+' if ctl >> i & 1 else '-'}" for i, n in enumerate(ACS_BITS))


def _bus(bdf: str) -> int:
    return int(bdf.split(":")[-2], 16)


def _below(b: Bridge, gpus: list[str]) -> list[str]:
    return [g for g in gpus if b.secondary <= _bus(g) <= b.subordinate]


def decide(f: AcsFacts) -> Finding:
    """Pure: the pcie-acs finding."""
    ev = AcsEvidence(
        [
            {
                "bdf": b.bdf,
                "port_type": b.port_type,
                "acsctl": None if b.acsctl is None else f"0x{b.acsctl:04x}",
                "gpus": _below(b, f.gpus),
            }
            for b in f.bridges
        ],
        dict(f.iommu),
    )
    red = [b for b in f.bridges if b.acsctl is not None and b.acsctl & (RR | CR)]
    harmful, harmless = [], []
    for b in red:
        gpus = _below(b, f.gpus)
        if b.port_type == PORT_DOWNSTREAM:
            siblings = [
                o
                for o in f.bridges
                if o is not b and o.bdf.split(":")[-2] == b.bdf.split(":")[-2] and _below(o, f.gpus)
            ]
            (harmful if siblings else harmless).append(
                (b, gpus, "switch port with GPU peers behind the switch")
            )
        elif any(f.iommu.get(g) in TRANSLATING for g in gpus):
            harmful.append((b, gpus, "root port, IOMMU translating the GPU's DMA"))
        else:
            harmless.append((b, gpus, "no GPU peer it redirects / IOMMU off or passthrough"))
    if harmful:
        ev.redirecting = [b.bdf for b, _, _ in harmful]
        shown = "; ".join(
            f"{b.bdf} ({why}) ACSCtl {decode(b.acsctl or 0)} above {', '.join(g)}" for b, g, why in harmful
        )
        return Finding.failed(
            f"ACS redirects GPU peer traffic to the root complex: {shown}",
            cause="ACS P2P Request/Completion Redirect on the bridges above the GPUs: P2P goes through the "
            "root complex (and IOMMU), slowing tensor parallelism or hanging NCCL",
            repair="not changed by gpubox (no measured gate, and clearing ACS removes the IOMMU isolation VFIO "
            "passthrough relies on): disable ACS in the BIOS, or boot with pci=disable_acs_redir="
            + ";".join(b.bdf for b, _, _ in harmful)
            + "; check with lspci -vvv | grep ACSCtl, then compare NCCL busbw",
            evidence=ev,
        )
    with_cap = [b for b in f.bridges if b.acsctl is not None]
    detail = f"no ACS redirect in the way of GPU peer traffic ({len(f.bridges)} bridge(s) above the GPUs"
    detail += f", {len(with_cap)} with ACS)" if with_cap else ", none with ACS)"
    if harmless:
        detail += "; redirect set but harmless here on " + ", ".join(
            f"{b.bdf} ({why})" for b, _, why in harmless
        )
    return Finding.ok(detail, evidence=ev)


def _port_and_acs(host, b: Bridge) -> None:
    """Port type (PCIe capability) and ACS Control (ECAP_ACS+6) of one bridge; None where absent."""
    t = host.run([*setpci_base(host), "-s", b.bdf, "CAP_EXP+2.w"], timeout=30)
    if t.rc == 0 and t.stdout.strip():
        b.port_type = (int(t.stdout.split()[0], 16) >> 4) & 0xF
    a = host.run([*setpci_base(host), "-s", b.bdf, "ECAP_ACS+6.w"], timeout=30)
    if a.rc == 0 and a.stdout.strip():
        b.acsctl = int(a.stdout.split()[0], 16)


class AcsRead(Fact):
    """For each bridge above a GPU: bus range, port type and ACS Control, through the real setpci."""

    @staticmethod
    def read(host) -> AcsFacts:
        funcs = PciFunctions.parse(PciFunctions.read(host))
        gpus = [f.bdf for f in funcs if f.vendor == NVIDIA_VENDOR and f.kind == "gpu"]
        out = AcsFacts(gpus)
        bridges = [f.bdf for f in funcs if f.base_class == BRIDGE_CLASS]
        if gpus and bridges:
            # one setpci run for every bridge's bus range (type 1 headers always have both registers)
            argv = [*setpci_base(host)]
            for bdf in bridges:
                argv += ["-s", bdf, "SECONDARY_BUS.b", "SUBORDINATE_BUS.b"]
            r = host.run(argv, timeout=60)
            vals = r.stdout.split()
            if r.rc == 0 and len(vals) == 2 * len(bridges):
                for k, bdf in enumerate(bridges):
                    b = Bridge(bdf, int(vals[2 * k], 16), int(vals[2 * k + 1], 16))
                    if _below(b, gpus):
                        _port_and_acs(host, b)
                        out.bridges.append(b)
        for g in gpus:
            out.iommu[g] = host.read_text(f"/sys/bus/pci/devices/{g}/iommu_group/type", default="").strip()
        return out
