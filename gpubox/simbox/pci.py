"""Simulated PCI devices: the host's /sys/bus/pci/devices tree with real config-space bytes.

Each function directory holds a 4096-byte `config` (what the kernel exposes to root) plus the
attribute files pciutils' linux-sysfs backend and the kernel provide (vendor, device, class,
subsystem_*, irq, resource, numa_node, *_link_speed/width). The bytes are laid out so that the
REAL `lspci -vvv -A linux-sysfs -O sysfs.path=<root>/sys/bus/pci` decodes them like a real box
(docs/facts.md "PCIe Device Control": DevCtl at CAP_EXP+8, MRRS bits 14:12, MPS bits 7:5), and the REAL
`setpci` writes into the same file.

Layout: per GPU a multi-function device BB:00 with function 0 = GPU (class 0x030200, 3D
controller) and function 1 = its HD-audio function (class 0x040300), plus one PCIe root port
(class 0x060400). GPUs 0..n/2-1 sit on NUMA node 0, the rest on node 1 (the seed box).
"""

from __future__ import annotations

import struct

from .core import SimBox

FAULTS = {
    "mrrs_512": "PCIe MaxReadReq back at 512 bytes on some GPUs (firmware default after reboot)",
    "link_degraded": "one GPU trained at Gen4 x8 instead of Gen5 x16",
    "no_pcie_cap": "a GPU-class NVIDIA function without a PCI Express capability",
    "acs_redirect": "the root port above GPU 0 has ACS P2P redirect on (ACSCtl 0x001d) and the IOMMU "
    "translates the GPU's DMA (NVIDIA/nccl#2079)",
}
ACS_CTL_REDIRECT = 0x001D  # SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+, as read in NVIDIA/nccl#2079

NVIDIA = 0x10DE
GPU_DEVICE = 0x2BB5  # RTX PRO 6000 Blackwell Server Edition (GB202); older pci.ids print "Device 2bb5"
AUDIO_DEVICE = 0x22E8  # GB202 High Definition Audio Controller
SUBSYS = (0x10DE, 0x204B)
# Bus numbers of a 2-socket board, the same as the lxc piece's /proc/driver/nvidia/gpus (one bus
# per GPU, the first half on socket 0); more than 8 GPUs continue on further buses.
BUSES = [0x17, 0x3D, 0x63, 0x89, 0x97, 0xBD, 0xE3, 0xE9, 0x18, 0x3E, 0x64, 0x8A, 0x98, 0xBE, 0xE4, 0xEA]
ROOT_PORT = "0000:00:01.1"
NO_CAP_BDF = "0000:e1:00.0"

# Healthy DevCtl: MRRS 4096 (5<<12), ext tag (bit 8), MPS 256 (1<<5), relaxed ordering (bit 4),
# fatal/non-fatal error reporting (bits 2,1) -- the H200 of docs/facts.md read 0x5134.
DEVCTL_OK = 0x5136
# mrrs_512: MRRS code 2 with assorted MPS and other bits, on some GPUs only.
DEVCTL_512 = [0x2936, 0x2056, 0x2817, 0x2110]
AUDIO_DEVCTL = 0x2810  # audio functions: MRRS 512, no snoop; must never be touched
SPEED_GTS = {1: "2.5", 2: "5.0", 3: "8.0", 4: "16.0", 5: "32.0"}

CAP_PM, CAP_MSI, CAP_EXP = 0x60, 0x68, 0x78


def _put(buf: bytearray, off: int, fmt: str, val: int) -> None:
    struct.pack_into("<" + fmt, buf, off, val)


def config_space(
    *,
    vendor: int,
    device: int,
    klass: int,
    multi: bool,
    devctl: int | None,
    lnkcap: tuple[int, int] = (5, 16),
    lnksta: tuple[int, int] = (5, 16),
    port_type: int = 0,
    bridge_bus: int | None = None,
) -> bytes:
    """4096 bytes of config space: type 0 (or type 1 with bridge_bus) header, PM and MSI
    capabilities, and a PCIe capability (v2) unless devctl is None."""
    b = bytearray(4096)
    _put(b, 0x00, "H", vendor)
    _put(b, 0x02, "H", device)
    _put(b, 0x04, "H", 0x0406 if bridge_bus is None else 0x0407)  # mem space, bus master, INTx off
    _put(b, 0x06, "H", 0x0010)  # status: capability list
    _put(b, 0x08, "I", (klass << 8) | 0xA1)  # class code + revision
    b[0x0C] = 0x10  # cache line size
    b[0x0E] = (0x80 if multi else 0x00) | (0x01 if bridge_bus is not None else 0x00)
    if bridge_bus is None:
        _put(b, 0x10, "I", 0xE2000000)  # BAR0: 32-bit mem (registers)
        _put(b, 0x14, "I", 0x0000000C)  # BAR1: 64-bit prefetchable VRAM window
        _put(b, 0x18, "I", 0x00002000)
        _put(b, 0x2C, "H", SUBSYS[0])
        _put(b, 0x2E, "H", SUBSYS[1])
    else:
        b[0x18], b[0x19], b[0x1A] = 0x00, bridge_bus, bridge_bus  # primary/secondary/subordinate
    b[0x34] = CAP_PM
    b[0x3C], b[0x3D] = 0x0B, 0x01  # IRQ line, INTA
    # Power management (id 1) -> MSI (id 5) -> PCIe (id 0x10)
    b[CAP_PM], b[CAP_PM + 1] = 0x01, CAP_MSI
    _put(b, CAP_PM + 2, "H", 0x0003)
    b[CAP_MSI], b[CAP_MSI + 1] = 0x05, CAP_EXP if devctl is not None else 0x00
    _put(b, CAP_MSI + 2, "H", 0x0080)  # 64-bit MSI, disabled
    if devctl is not None:
        e = CAP_EXP
        b[e], b[e + 1] = 0x10, 0x00
        _put(b, e + 2, "H", 0x0002 | (port_type << 4))  # cap version 2, port type
        _put(
            b, e + 4, "I", 0x10008FE2 if port_type == 0 else 0x00008002
        )  # DevCap: MPS 512, RBER, FLR (bit 28)
        _put(b, e + 8, "H", devctl)  # DevCtl
        _put(b, e + 0x0A, "H", 0x0000)  # DevSta
        cap_speed, cap_width = lnkcap
        _put(b, e + 0x0C, "I", cap_speed | (cap_width << 4) | (0x3 << 10) | (0x1 << 15) | (0x1 << 22))
        _put(b, e + 0x10, "H", 0x0040)  # LnkCtl: common clock
        sta_speed, sta_width = lnksta
        _put(b, e + 0x12, "H", sta_speed | (sta_width << 4) | (1 << 12))  # LnkSta + slot clock
        _put(b, e + 0x24, "I", 0x00000A80 if port_type == 0 else 0x00000000)  # DevCap2
        _put(b, e + 0x2C, "I", ((1 << (cap_speed + 1)) - 2))  # LnkCap2: supported speeds vector
        _put(b, e + 0x30, "H", cap_speed)  # LnkCtl2: target speed
    return bytes(b)


def _write_function(
    sim: SimBox,
    bdf: str,
    cfg: bytes,
    *,
    numa: int,
    irq: int,
    link: tuple[tuple[int, int], tuple[int, int]] | None,
) -> None:
    d = sim.hpath(f"/sys/bus/pci/devices/{bdf}")
    d.mkdir(parents=True, exist_ok=True)
    (d / "config").write_bytes(cfg)
    vendor, device = struct.unpack_from("<HH", cfg, 0)
    klass = struct.unpack_from("<I", cfg, 8)[0] >> 8
    (d / "vendor").write_text(f"0x{vendor:04x}\n")
    (d / "device").write_text(f"0x{device:04x}\n")
    (d / "class").write_text(f"0x{klass:06x}\n")
    (d / "revision").write_text(f"0x{cfg[8]:02x}\n")
    sv, sd = struct.unpack_from("<HH", cfg, 0x2C)
    (d / "subsystem_vendor").write_text(f"0x{sv:04x}\n")
    (d / "subsystem_device").write_text(f"0x{sd:04x}\n")
    (d / "irq").write_text(f"{irq}\n")
    (d / "numa_node").write_text(f"{numa}\n")
    (d / "enable").write_text("1\n")
    if klass >> 8 == 0x0604:
        res = ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 13
    else:
        res = [
            "0x00000000e2000000 0x00000000e2ffffff 0x0000000000040200",
            "0x0000200000000000 0x00002001ffffffff 0x000000000014220c",
        ] + ["0x0000000000000000 0x0000000000000000 0x0000000000000000"] * 11
    (d / "resource").write_text("\n".join(res) + "\n")
    if link is not None:
        (cap_s, cap_w), (sta_s, sta_w) = link
        (d / "max_link_speed").write_text(f"{SPEED_GTS[cap_s]} GT/s PCIe\n")
        (d / "max_link_width").write_text(f"{cap_w}\n")
        (d / "current_link_speed").write_text(f"{SPEED_GTS[sta_s]} GT/s PCIe\n")
        (d / "current_link_width").write_text(f"{sta_w}\n")


def gpu_bdfs(n: int) -> list[str]:
    return [f"0000:{BUSES[i]:02x}:00.0" for i in range(n)]


def build(sim: SimBox, faults: set[str]) -> None:
    n = sim.gpus
    half = max(1, n // 2) if n > 1 else 1
    _write_function(
        sim,
        ROOT_PORT,
        config_space(
            vendor=0x8086,
            device=0x352A,
            klass=0x060400,
            multi=True,
            devctl=0x0036,
            port_type=4,
            bridge_bus=BUSES[0],
        ),
        numa=0,
        irq=0,
        link=((5, 16), (5, 16)),
    )
    if "acs_redirect" in faults:  # ACS extended capability (id 0x000d, v1) at 0x100 of the root port
        cfg = sim.hpath(f"/sys/bus/pci/devices/{ROOT_PORT}/config")
        b = bytearray(cfg.read_bytes())
        _put(b, 0x100, "I", 0x000D | (1 << 16))
        _put(b, 0x104, "H", 0x005F)  # ACS Capability: SV TB RR CR UF EC
        _put(b, 0x106, "H", ACS_CTL_REDIRECT)
        cfg.write_bytes(bytes(b))
    for i, bdf in enumerate(gpu_bdfs(n)):
        numa = 0 if i < half else 1
        devctl = DEVCTL_OK
        if "mrrs_512" in faults and i % 3 == 0:  # GPUs 0, 3, 6: some, not all
            devctl = DEVCTL_512[(i // 3) % len(DEVCTL_512)]
        lnksta = (4, 8) if ("link_degraded" in faults and i == min(2, n - 1)) else (5, 16)
        _write_function(
            sim,
            bdf,
            config_space(
                vendor=NVIDIA, device=GPU_DEVICE, klass=0x030200, multi=True, devctl=devctl, lnksta=lnksta
            ),
            numa=numa,
            irq=200 + i,
            link=((5, 16), lnksta),
        )
        if "acs_redirect" in faults and i == 0:
            grp = sim.hpath(f"/sys/bus/pci/devices/{bdf}/iommu_group")
            grp.mkdir(parents=True, exist_ok=True)
            (grp / "type").write_text("DMA\n")
        audio = bdf[:-1] + "1"
        _write_function(
            sim,
            audio,
            config_space(
                vendor=NVIDIA,
                device=AUDIO_DEVICE,
                klass=0x040300,
                multi=True,
                devctl=AUDIO_DEVCTL,
                lnksta=lnksta,
            ),
            numa=numa,
            irq=220 + i,
            link=((5, 16), lnksta),
        )
    if "no_pcie_cap" in faults:
        _write_function(
            sim,
            NO_CAP_BDF,
            config_space(vendor=NVIDIA, device=GPU_DEVICE, klass=0x030200, multi=False, devctl=None),
            numa=1 if n > 1 else 0,
            irq=240,
            link=None,
        )
