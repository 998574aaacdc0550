"""PCIe Device Control on the GPU functions: MaxReadReq (tuned) and link status (reported).

Facts (docs/facts.md "PCIe Device Control"): DevCtl is the 16-bit word at CAP_EXP+8; bits 7:5 are
Max_Payload_Size, bits 14:12 Max_Read_Request_Size (n -> 128<<n bytes, n = 0..5), bit 15 is
Initiate FLR on endpoints. So we only ever write `CAP_EXP+8.w=<n<<12>:7000` (a masked
read-modify-write done by setpci itself), read the word back and prove that no bit outside 14:12
moved. `-d 10de:` would also hit the GPU's HD-audio function, so GPU functions are picked by class
0300/0302 from sysfs. Everything goes through the REAL pciutils with `-A linux-sysfs -O
sysfs.path=<root>/sys/bus/pci`, which is how tests run against a simulated box.

This module holds the facts (sysfs, setpci, lockdown, the boot unit: `read` does the I/O, `parse`
is pure) and the pure register arithmetic; the steps that decide live in hwtune/pcie_mrrs_step.py and pcie_link_step.py.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpubox.errors import BadInput, GpuboxError
from gpubox.facts import Fact
from gpubox.steps import HostPath

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0300", "0302")  # VGA controller, 3D controller
AUDIO_CLASS = "0403"
BRIDGE_CLASS = "0604"
MRRS_MASK = 0x7000
MPS_MASK = 0x00E0
FLR_BIT = 0x8000
UNIT = "gpubox-pcie-mrrs.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
LOCKDOWN = "/sys/kernel/security/lockdown"
SYSFS_PCI = "/sys/bus/pci"
DEVICES = f"{SYSFS_PCI}/devices"
SPEEDS = {1: "2.5GT/s", 2: "5GT/s", 3: "8GT/s", 4: "16GT/s", 5: "32GT/s", 6: "64GT/s"}


# -- values ------------------------------------------------------------------------------------
def parse_mrrs(value) -> int:
    """MaxReadReq target as the 0..5 code; accepts bytes (128..4096, a power of two) or the code.

    Anything else (3000, 6, -1, 8192, "abc") is bad input: the codes 6 and 7 are reserved."""
    text = str(value).strip()
    try:
        n = int(text, 0)
    except ValueError:
        n = None
    if n is not None and 0 <= n <= 5:
        return n
    if n is not None and 128 <= n <= 4096 and n & (n - 1) == 0:
        return (n // 128).bit_length() - 1
    raise GpuboxError(
        f"invalid MaxReadReq {text!r}", "use bytes 128, 256, 512, 1024, 2048 or 4096, or the code 0..5"
    )


def mrrs_bytes(code: int) -> int:
    return 128 << code


def decode_devctl(word: int) -> dict:
    """The fields of DevCtl that matter here (pci_regs.h PCI_EXP_DEVCTL_*)."""
    return {
        "word": f"0x{word:04x}",
        "mps": 128 << ((word & MPS_MASK) >> 5),
        "mrrs": 128 << ((word & MRRS_MASK) >> 12) if (word & MRRS_MASK) >> 12 <= 5 else None,
        "mrrs_code": (word & MRRS_MASK) >> 12,
        "relaxed_ordering": bool(word & 0x10),
        "no_snoop": bool(word & 0x800),
        "ext_tag": bool(word & 0x100),
        "flr_bit": bool(word & FLR_BIT),
    }


# -- PCI functions in sysfs --------------------------------------------------------------------
@dataclass
class PciFunction:
    bdf: str
    vendor: str
    device: str
    klass: str  # 6 hex digits, e.g. 030200
    numa_node: int | None = None

    @property
    def base_class(self) -> str:
        return self.klass[:4]

    @property
    def kind(self) -> str:
        kinds = {"0300": "gpu", "0302": "gpu", AUDIO_CLASS: "audio", BRIDGE_CLASS: "bridge"}
        return kinds.get(self.base_class, "other")


def _read_attr(host, bdf: str, name: str) -> str:
    return host.read_text(f"{DEVICES}/{bdf}/{name}", default="")


class PciFunctions(Fact):
    """Every PCI function in the host's sysfs (root prefix honoured): read gives
    [(bdf, vendor, device, class, numa_node)] as the attribute files say, parse the PciFunctions."""

    @staticmethod
    def read(host) -> list[tuple[str, str, str, str, str]]:
        try:
            names = sorted(host.listdir(DEVICES))
        except FileNotFoundError:
            raise GpuboxError(
                f"{host.name}: {host.path(DEVICES)} does not exist",
                "is this a Linux host with sysfs (or is gpubox_root wrong)?",
            ) from None
        return [
            (bdf, *(_read_attr(host, bdf, a) for a in ("vendor", "device", "class", "numa_node")))
            for bdf in names
        ]

    @staticmethod
    def parse(raw) -> list[PciFunction]:
        return [function_from_attrs(*r) for r in raw]


def function_from_attrs(bdf: str, vendor: str, device: str, klass: str, numa: str) -> PciFunction:
    """One function from its sysfs attribute texts; numa_node -1 means unknown (docs/facts.md)."""
    try:
        node = int(numa.strip())
    except ValueError:
        node = None
    return PciFunction(
        bdf,
        vendor.strip().lower(),
        device.strip().lower(),
        klass.strip().lower().removeprefix("0x").rjust(6, "0"),
        node if node is not None and node >= 0 else None,
    )


def list_functions(host) -> list[PciFunction]:
    """Every PCI function in the host's sysfs (root prefix honoured)."""
    return PciFunctions.parse(PciFunctions.read(host))


def pick_functions(
    funcs: list[PciFunction], include: tuple[str, ...] | list[str] = (), host_name: str = "-"
) -> list[PciFunction]:
    """NVIDIA GPU functions (class 0300/0302), plus what `include` asks for: "audio", "bridge",
    or explicit BDFs. Never the audio function or bridges by default."""
    inc = {i.strip().lower() for i in include if i and i.strip()}
    by_bdf = {f.bdf: f for f in funcs}
    picked = []
    for f in funcs:
        nvidia = f.vendor == NVIDIA_VENDOR
        if (
            (nvidia and f.kind == "gpu")
            or (nvidia and f.kind == "audio" and "audio" in inc)
            or (f.kind == "bridge" and "bridge" in inc)
            or f.bdf in inc
        ):
            picked.append(f)
    for name in inc - {"audio", "bridge"}:
        bdf = name if name.count(":") == 2 else f"0000:{name}"
        if bdf not in by_bdf:  # bad input the host shows: the whole run ends with exit 2
            raise BadInput(
                f"--include {name}: no PCI function {bdf} on {host_name}",
                "give a BDF from `lspci -D`, or 'audio' / 'bridge'",
            )
        if by_bdf[bdf] not in picked:
            picked.append(by_bdf[bdf])
    return sorted(picked, key=lambda f: f.bdf)


def select_functions(host, include: tuple[str, ...] | list[str] = ()) -> list[PciFunction]:
    return pick_functions(list_functions(host), include, host.name)


# -- config space: header (sysfs) and the PCIe registers (setpci) ------------------------------
def setpci_base(host) -> list[str]:
    return ["setpci", "-A", "linux-sysfs", "-O", f"sysfs.path={host.sysfs_pci}"]


def setpci_args() -> list[Any]:
    """setpci on the host's sysfs, as plan argv (the root prefix is resolved when shown or run)."""
    return ["setpci", "-A", "linux-sysfs", "-O", HostPath(SYSFS_PCI, prefix="sysfs.path=")]


class NoPcieCap(GpuboxError):
    pass


class Unreadable(GpuboxError):
    """Config space that does not read back sanely: never written to."""


UNREADABLE_FIX = (
    "the device may have fallen off the bus: check dmesg/lspci -vvv, reseat or reboot; "
    "gpubox writes nothing to it"
)


class ConfigHeader(Fact):
    """Why a function's config header (sysfs `config`, first 64 bytes) is unreadable, or None."""

    @staticmethod
    def read(host, bdf: str) -> bytes | str:
        try:
            return host.read_bytes(f"{DEVICES}/{bdf}/config")[:64]
        except OSError as exc:
            return f"config space cannot be read ({exc.strerror or exc})"

    @staticmethod
    def parse(raw: bytes | str, bdf: str = "") -> str | None:
        return header_problem(raw)


def header_problem(head: bytes | str) -> str | None:
    """Too short, or vendor all-ones = unreadable (a str is the read error itself)."""
    if isinstance(head, str):
        return head
    if len(head) < 64:
        return f"config space truncated ({len(head)} of at least 64 header bytes)"
    if head[0:2] == b"\xff\xff":
        return "config space reads all-ones (vendor 0xffff): the device fell off the bus"
    return None


def config_problem(host, bdf: str) -> str | None:
    """The function's config header read from sysfs: too short or vendor all-ones = unreadable."""
    return ConfigHeader.parse(ConfigHeader.read(host, bdf), bdf)


@dataclass(frozen=True)
class SetpciAnswer:
    """What one setpci call answered, and on which host (for the messages)."""

    host: str
    rc: int
    stdout: str
    stderr: str


# What PcieRegs reads, in order: DevCtl, LnkCap, LnkSta, the capability's version (PCIe
# Capabilities Register, bits 3:0) and LnkCtl2 (Target Link Speed 3:0, Hardware Autonomous Speed
# Disable bit 5), which exists only from version 2 on (linux pci_regs.h PCI_EXP_FLAGS_VERS,
# PCI_EXP_LNKCTL2, PCI_EXP_LNKCTL2_TLS, PCI_EXP_LNKCTL2_HASD).
REG_ARGS = ("CAP_EXP+8.w", "CAP_EXP+0c.l", "CAP_EXP+12.w", "CAP_EXP+2.w", "CAP_EXP+30.w")
HASD_BIT = 0x20


class PcieRegs(Fact):
    """DevCtl, LnkCap, LnkSta and LnkCtl2 of one function through the real setpci (one call, reads only)."""

    @staticmethod
    def read(host, bdf: str) -> SetpciAnswer:
        r = host.run([*setpci_base(host), "-s", bdf, *REG_ARGS], timeout=30)
        return SetpciAnswer(host.name, r.rc, r.stdout, r.stderr)

    @staticmethod
    def parse(raw: SetpciAnswer, bdf: str) -> dict[str, int]:
        return parse_regs(raw, bdf)


def parse_regs(r: SetpciAnswer, bdf: str) -> dict[str, int]:
    """setpci's answer -> {"devctl", "lnkcap", "lnksta", "lnkctl2"} (lnkctl2 None below capability
    version 2); NoPcieCap / Unreadable for this function, GpuboxError when setpci itself cannot run."""
    if r.rc != 0:
        if "not found" in r.stderr and "0010" in r.stderr:
            raise NoPcieCap(
                f"{bdf} has no PCI Express capability",
                "it cannot take a MaxReadReq setting and is left alone; check the device or its passthrough",
            )
        if r.rc == 127:
            raise GpuboxError(f"setpci is not installed on {r.host}", "install pciutils")
        raise GpuboxError(
            f"setpci could not read {bdf} on {r.host}: {(r.stderr or r.stdout).strip()}",
            "run as root; check the BDF with lspci -D",
        )
    try:
        vals = [int(x, 16) for x in r.stdout.split()]
    except ValueError:
        vals = []
    if len(vals) != len(REG_ARGS):
        raise GpuboxError(f"setpci printed {r.stdout!r} for {bdf}", "report this: unexpected pciutils output")
    regs = {"devctl": vals[0], "lnkcap": vals[1], "lnksta": vals[2]}
    regs["lnkctl2"] = vals[4] if vals[3] & 0xF >= 2 and vals[3] != 0xFFFF else None
    problem = insane_regs(regs)
    if problem:
        raise Unreadable(f"{bdf}: {problem}", UNREADABLE_FIX)
    return regs


def read_regs(host, bdf: str) -> dict[str, int]:
    """DevCtl, LnkCap and LnkSta of one function through the real setpci (one call)."""
    return PcieRegs.parse(PcieRegs.read(host, bdf), bdf)


def insane_regs(regs: dict[str, int]) -> str | None:
    """Why these register values cannot come from a healthy function, or None.

    PCIe base spec, Device Control: bit 15 (Initiate FLR) always reads 0; MPS (7:5) and MRRS
    (14:12) codes 6 and 7 are reserved. A read of all-ones is what a function that fell off the
    bus (or a truncated config file) returns. Writing a masked value back to any of these would
    act on garbage (docs/facts.md "PCIe Device Control")."""
    dc = regs["devctl"]
    if dc == 0xFFFF or regs.get("lnkcap") == 0xFFFFFFFF or regs.get("lnksta") == 0xFFFF:
        return "PCIe registers read all-ones (device unreadable / fallen off the bus, or config truncated)"
    if dc & FLR_BIT:
        return f"DevCtl 0x{dc:04x} has bit 15 (Initiate FLR) set, which always reads 0 on a sane device"
    if (dc & MRRS_MASK) >> 12 > 5 or (dc & MPS_MASK) >> 5 > 5:
        return f"DevCtl 0x{dc:04x} holds a reserved MaxPayload/MaxReadReq encoding (6 or 7)"
    return None


# -- kernel lockdown and the boot unit ---------------------------------------------------------
class Lockdown(Fact):
    """The active kernel lockdown mode ("integrity"/"confidentiality"), None when off or absent."""

    @staticmethod
    def read(host) -> str:
        return host.read_text(LOCKDOWN, default="")

    @staticmethod
    def parse(raw: str) -> str | None:
        m = re.search(r"\[(\w+)\]", raw)
        return None if not m or m.group(1) == "none" else m.group(1)


class UnitFile(Fact):
    """The boot unit's text, "" when absent."""

    @staticmethod
    def read(host) -> str:
        return host.read_text(UNIT_PATH, default="")


class UnitEnabled(Fact):
    """What `systemctl is-enabled` says of the boot unit ("enabled", "disabled", ...)."""

    @staticmethod
    def read(host) -> str:
        return host.run(["systemctl", "is-enabled", UNIT], timeout=30).stdout

    @staticmethod
    def parse(raw: str) -> str:
        return raw.strip()


# -- one function's state ----------------------------------------------------------------------
@dataclass
class DeviceState:
    bdf: str
    kind: str
    numa_node: int | None = None
    devctl: int | None = None
    error: str | None = None
    link: dict = field(default_factory=dict)
    unreadable: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.devctl is not None:
            d["decoded"] = decode_devctl(self.devctl)
            d["devctl"] = f"0x{self.devctl:04x}"
        return d


def link_info(lnkcap: int, lnksta: int) -> dict:
    cap_s, cap_w = lnkcap & 0xF, (lnkcap >> 4) & 0x3F
    sta_s, sta_w = lnksta & 0xF, (lnksta >> 4) & 0x3F
    return {
        "cap_gen": cap_s,
        "cap_width": cap_w,
        "gen": sta_s,
        "width": sta_w,
        "cap": f"Gen{cap_s} x{cap_w}",
        "now": f"Gen{sta_s} x{sta_w}",
        "degraded": sta_s < cap_s or sta_w < cap_w,
    }


def _word(v: int | str | None) -> int | None:
    return int(v, 16) if isinstance(v, str) else v


@dataclass
class DeviceRegs:
    """What was read of one selected function: its registers, or why they cannot be used
    (`unreadable`: config space is garbage; an `error` alone: no PCIe capability). Register words
    may be given as hex strings ("0x5136") in data cases."""

    bdf: str
    kind: str
    numa_node: int | None = None
    devctl: int | None = None
    lnkcap: int | None = None
    lnksta: int | None = None
    error: str | None = None
    unreadable: bool = False
    lnkctl2: int | None = None  # None: not read, or a capability of version 1 (no such register)
    ident: str | None = None  # vendor:device:class as setpci's -d takes it, e.g. "10de:2bb5:0302"

    def __post_init__(self) -> None:
        self.devctl, self.lnkcap, self.lnksta = _word(self.devctl), _word(self.lnkcap), _word(self.lnksta)
        self.lnkctl2 = _word(self.lnkctl2)

    def state(self) -> DeviceState:
        link = link_info(self.lnkcap, self.lnksta) if self.devctl is not None else {}
        return DeviceState(
            self.bdf, self.kind, self.numa_node, self.devctl, self.error, link, self.unreadable
        )


def ident(f: PciFunction) -> str:
    """vendor:device:class of a function as setpci/lspci `-d` select it (class = base + sub class)."""
    return f"{f.vendor.removeprefix('0x')}:{f.device.removeprefix('0x')}:{f.klass[:4]}"


def device_regs(fact: Callable[..., Any], f: PciFunction) -> DeviceRegs:
    """Read one function through `fact(FactClass, *args)` (ctx.fact, or a direct read): the
    config header first; a function that fails it is never asked for its registers."""
    problem = fact(ConfigHeader, f.bdf)
    base = {"bdf": f.bdf, "kind": f.kind, "numa_node": f.numa_node, "ident": ident(f)}
    if problem:
        return DeviceRegs(**base, error=f"{f.bdf}: {problem}", unreadable=True)
    try:
        regs = fact(PcieRegs, f.bdf)
    except Unreadable as exc:
        return DeviceRegs(**base, error=exc.problem, unreadable=True)
    except NoPcieCap as exc:
        return DeviceRegs(**base, error=str(exc))
    return DeviceRegs(
        **base, devctl=regs["devctl"], lnkcap=regs["lnkcap"], lnksta=regs["lnksta"], lnkctl2=regs["lnkctl2"]
    )


class BridgeBuses(Fact):
    """The secondary bus of every PCI bridge (config header byte 0x19 of a type-1 header): which
    port a function sits below, as `lspci -t` draws it. {bdf: secondary bus}."""

    @staticmethod
    def read(host) -> dict[str, int]:
        out = {}
        for f in PciFunctions.parse(PciFunctions.read(host)):
            if f.kind != "bridge":
                continue
            try:
                head = host.read_bytes(f"{DEVICES}/{f.bdf}/config")[:64]
            except OSError:
                continue
            if len(head) >= 0x1A and head[0:2] != b"\xff\xff" and head[0x0E] & 0x7F == 1:
                out[f.bdf] = head[0x19]
        return out


def upstream_port(bridges: dict[str, int], bdf: str) -> str | None:
    """Pure: the bridge whose secondary bus is BDF's bus, in BDF's domain (None: none seen)."""
    domain, bus = bdf.split(":")[0], int(bdf.split(":")[1], 16)
    for port, sec in sorted(bridges.items()):
        if port.split(":")[0] == domain and sec == bus and port != bdf:
            return port
    return None


def read_devices(host, include=()) -> list[DeviceRegs]:
    """The selected functions' registers, read directly (no run's fact cache)."""

    def direct(fact, *args):
        return fact.parse(fact.read(host, *args), *args)

    return [device_regs(direct, f) for f in select_functions(host, include)]


def read_states(host, include=()) -> list[DeviceState]:
    return [d.state() for d in read_devices(host, include)]


# -- the write, its read-back, and the boot unit -----------------------------------------------
def write_argv(host, bdf: str, code: int) -> list[str]:
    """The masked write: only bits 14:12 can change (bit 15 would start an FLR)."""
    return [*setpci_base(host), "-s", bdf, f"CAP_EXP+8.w={code << 12:04x}:{MRRS_MASK:04x}"]


def masked_write(bdf: str, code: int) -> list[Any]:
    """write_argv as plan argv (root prefix resolved when the plan is shown or run)."""
    return [*setpci_args(), "-s", bdf, f"CAP_EXP+8.w={code << 12:04x}:{MRRS_MASK:04x}"]


def check_write(bdf: str, before: int, code: int, host) -> None:
    """Post-condition of the masked write (reads only): DevCtl read back may differ from `before`
    in bits 14:12 alone, and must hold the new code there."""
    after = read_regs(host, bdf)["devctl"]
    moved = before ^ after
    if moved & ~MRRS_MASK or (after & MRRS_MASK) >> 12 != code:
        raise GpuboxError(
            f"{bdf}: DevCtl 0x{before:04x} -> 0x{after:04x}: bits outside 14:12 "
            "changed or MaxReadReq did not take",
            "stop and inspect the device with lspci -vvv",
        )


SETPCI = "/usr/bin/setpci"  # pciutils on Debian/Proxmox (checked on the host: gpubox.bootbins)


def unit_text(functions: list[tuple[str, str]], code: int) -> str:
    """Boot-time re-apply: values are lost at reboot (docs/facts.md). FUNCTIONS are (bus id, ident)
    as recorded at install: each write selects the function by bus id AND vendor:device:class
    (`setpci -s BDF -d VVVV:DDDD:CCCC`, one process reading the IDs and writing), so after a hardware
    change the config space of whatever now sits at that address is never touched; setpci logs
    "Warning: No devices selected" for it in the unit's journal and goes on (exit 0).

    Ordered after systemd-modules-load (the NVIDIA driver loaded and bound: gpubox's
    modules-load.d names nvidia-uvm) and before Proxmox starts the guests; the PCI functions
    themselves exist from the kernel's enumeration on, so no udev settling is waited for (the
    deprecated systemd-udev-settle.service)."""
    lines = [
        "# Managed by gpubox (hwtune pcie): re-applies PCIe MaxReadReq at boot, only on the functions",
        "# recorded at install (bus id + vendor:device:class); a function that changed is skipped by",
        "# setpci (journal: 'Warning: No devices selected').",
        "[Unit]",
        f"Description=gpubox: PCIe MaxReadReq {mrrs_bytes(code)} on NVIDIA GPU functions",
        "After=systemd-modules-load.service",
        "Before=pve-guests.service",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
    ]
    lines += [
        f"ExecStart={SETPCI} -s {b} -d {ident} CAP_EXP+8.w={code << 12:04x}:{MRRS_MASK:04x}"
        for b, ident in functions
    ]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def unit_bdfs(text: str) -> list[str]:
    """The bus ids a boot unit written by unit_text names: gpubox's record of the box's GPUs."""
    return re.findall(r"^ExecStart=\S*setpci -s (\S+) ", text or "", re.M)


def _include(ctx) -> tuple[str, ...]:
    inc = ctx.opt("include") or ()
    items = (inc,) if isinstance(inc, str) else tuple(inc)
    return tuple(p for i in items for p in i.split(","))


def gather_devices(ctx) -> list[DeviceRegs]:
    """The selected functions (GPUs, plus --include) with their registers, read through ctx.fact
    (the pcie-mrrs and pcie-link steps)."""
    funcs = pick_functions(ctx.fact(PciFunctions), _include(ctx), ctx.host.name)
    return [device_regs(ctx.fact, f) for f in funcs]
