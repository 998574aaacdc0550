"""PCIe Device Control on the GPU functions: MaxReadReq (tuned) and link status (reported).

Facts (FACTS.md "PCIe Device Control"): DevCtl is the 16-bit word at CAP_EXP+8; bits 7:5 are
Max_Payload_Size, bits 14:12 Max_Read_Request_Size (n -> 128<<n bytes, n = 0..5), bit 15 is
Initiate FLR on endpoints. So we only ever write `CAP_EXP+8.w=<n<<12>:7000` (a masked
read-modify-write done by setpci itself), read the word back and prove that no bit outside 14:12
moved. `-d 10de:` would also hit the GPU's HD-audio function, so GPU functions are picked by class
0300/0302 from sysfs. Everything goes through the REAL pciutils with `-A linux-sysfs -O
sysfs.path=<root>/sys/bus/pci`, which is how tests run against a simulated box.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from gpubox.diffs import unified
from gpubox.errors import GpuboxError
from gpubox.steps import Finding, Plan, Step

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0300", "0302")          # VGA controller, 3D controller
AUDIO_CLASS = "0403"
BRIDGE_CLASS = "0604"
MRRS_MASK = 0x7000
MPS_MASK = 0x00E0
FLR_BIT = 0x8000
UNIT = "gpubox-pcie-mrrs.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
LOCKDOWN = "/sys/kernel/security/lockdown"
DEVICES = "/sys/bus/pci/devices"
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
    raise GpuboxError(f"invalid MaxReadReq {text!r}",
                      "use bytes 128, 256, 512, 1024, 2048 or 4096, or the code 0..5")


def mrrs_bytes(code: int) -> int:
    return 128 << code


def decode_devctl(word: int) -> dict:
    """The fields of DevCtl that matter here (pci_regs.h PCI_EXP_DEVCTL_*)."""
    return {"word": f"0x{word:04x}", "mps": 128 << ((word & MPS_MASK) >> 5),
            "mrrs": 128 << ((word & MRRS_MASK) >> 12) if (word & MRRS_MASK) >> 12 <= 5 else None,
            "mrrs_code": (word & MRRS_MASK) >> 12, "relaxed_ordering": bool(word & 0x10),
            "no_snoop": bool(word & 0x800), "ext_tag": bool(word & 0x100), "flr_bit": bool(word & FLR_BIT)}


# -- facts -------------------------------------------------------------------------------------
@dataclass
class PciFunction:
    bdf: str
    vendor: str
    device: str
    klass: str          # 6 hex digits, e.g. 030200
    numa_node: int | None = None

    @property
    def base_class(self) -> str:
        return self.klass[:4]

    @property
    def kind(self) -> str:
        return {"0300": "gpu", "0302": "gpu", AUDIO_CLASS: "audio", BRIDGE_CLASS: "bridge"}.get(self.base_class, "other")


def _read_attr(host, bdf: str, name: str) -> str:
    return host.read_text(f"{DEVICES}/{bdf}/{name}", default="").strip()


def list_functions(host) -> list[PciFunction]:
    """Every PCI function in the host's sysfs (root prefix honoured)."""
    out = []
    try:
        names = sorted(host.listdir(DEVICES))
    except FileNotFoundError:
        raise GpuboxError(f"{host.name}: {host.path(DEVICES)} does not exist",
                          "is this a Linux host with sysfs (or is gpubox_root wrong)?") from None
    for bdf in names:
        numa = _read_attr(host, bdf, "numa_node")
        try:
            node = int(numa)
        except ValueError:
            node = None
        out.append(PciFunction(bdf, _read_attr(host, bdf, "vendor").lower(), _read_attr(host, bdf, "device").lower(),
                               _read_attr(host, bdf, "class").lower().removeprefix("0x").rjust(6, "0"),
                               node if node is not None and node >= 0 else None))   # -1 = unknown (FACTS)
    return out


def select_functions(host, include: tuple[str, ...] | list[str] = ()) -> list[PciFunction]:
    """NVIDIA GPU functions (class 0300/0302), plus what `include` asks for: "audio", "bridge",
    or explicit BDFs. Never the audio function or bridges by default."""
    funcs = list_functions(host)
    inc = {i.strip().lower() for i in include if i and i.strip()}
    by_bdf = {f.bdf: f for f in funcs}
    picked = []
    for f in funcs:
        nvidia = f.vendor == NVIDIA_VENDOR
        if (nvidia and f.kind == "gpu") or (nvidia and f.kind == "audio" and "audio" in inc) \
                or (f.kind == "bridge" and "bridge" in inc) or f.bdf in inc:
            picked.append(f)
    for name in inc - {"audio", "bridge"}:
        bdf = name if name.count(":") == 2 else f"0000:{name}"
        if bdf not in by_bdf:
            raise GpuboxError(f"--include {name}: no PCI function {bdf} on {host.name}",
                              "give a BDF from `lspci -D`, or 'audio' / 'bridge'")
        if by_bdf[bdf] not in picked:
            picked.append(by_bdf[bdf])
    return sorted(picked, key=lambda f: f.bdf)


def setpci_base(host) -> list[str]:
    return ["setpci", "-A", "linux-sysfs", "-O", f"sysfs.path={host.sysfs_pci}"]


class NoPcieCap(GpuboxError):
    pass


def read_regs(host, bdf: str) -> dict[str, int]:
    """DevCtl, LnkCap and LnkSta of one function through the real setpci (one call)."""
    r = host.run([*setpci_base(host), "-s", bdf, "CAP_EXP+8.w", "CAP_EXP+0c.l", "CAP_EXP+12.w"], timeout=30)
    if r.rc != 0:
        if "not found" in r.stderr and "0010" in r.stderr:
            raise NoPcieCap(f"{bdf} has no PCI Express capability",
                            "it cannot take a MaxReadReq setting and is left alone; check the device or its passthrough")
        if r.rc == 127:
            raise GpuboxError(f"setpci is not installed on {host.name}", "install pciutils")
        raise GpuboxError(f"setpci could not read {bdf} on {host.name}: {(r.stderr or r.stdout).strip()}",
                          "run as root; check the BDF with lspci -D")
    try:
        vals = [int(x, 16) for x in r.stdout.split()]
    except ValueError:
        vals = []
    if len(vals) != 3:
        raise GpuboxError(f"setpci printed {r.stdout!r} for {bdf}", "report this: unexpected pciutils output")
    regs = {"devctl": vals[0], "lnkcap": vals[1], "lnksta": vals[2]}
    problem = insane_regs(regs)
    if problem:
        raise Unreadable(f"{bdf}: {problem}", UNREADABLE_FIX)
    return regs


class Unreadable(GpuboxError):
    """Config space that does not read back sanely: never written to."""


UNREADABLE_FIX = ("the device may have fallen off the bus: check dmesg/lspci -vvv, reseat or reboot; "
                  "gpubox writes nothing to it")


def insane_regs(regs: dict[str, int]) -> str | None:
    """Why these register values cannot come from a healthy function, or None.

    PCIe base spec, Device Control: bit 15 (Initiate FLR) always reads 0; MPS (7:5) and MRRS
    (14:12) codes 6 and 7 are reserved. A read of all-ones is what a function that fell off the
    bus (or a truncated config file) returns. Writing a masked value back to any of these would
    act on garbage (FACTS "PCIe Device Control")."""
    dc = regs["devctl"]
    if dc == 0xFFFF or regs.get("lnkcap") == 0xFFFFFFFF or regs.get("lnksta") == 0xFFFF:
        return "PCIe registers read all-ones (device unreadable / fallen off the bus, or config truncated)"
    if dc & FLR_BIT:
        return f"DevCtl 0x{dc:04x} has bit 15 (Initiate FLR) set, which always reads 0 on a sane device"
    if (dc & MRRS_MASK) >> 12 > 5 or (dc & MPS_MASK) >> 5 > 5:
        return f"DevCtl 0x{dc:04x} holds a reserved MaxPayload/MaxReadReq encoding (6 or 7)"
    return None


def config_problem(host, bdf: str) -> str | None:
    """The function's config header read from sysfs: too short or vendor all-ones = unreadable."""
    try:
        head = host.read_bytes(f"{DEVICES}/{bdf}/config")[:64]
    except OSError as exc:
        return f"config space cannot be read ({exc.strerror or exc})"
    if len(head) < 64:
        return f"config space truncated ({len(head)} of at least 64 header bytes)"
    if head[0:2] == b"\xff\xff":
        return "config space reads all-ones (vendor 0xffff): the device fell off the bus"
    return None


def lockdown_mode(host) -> str | None:
    """The active kernel lockdown mode ("integrity"/"confidentiality"), None when off or absent."""
    text = host.read_text(LOCKDOWN, default="")
    m = re.search(r"\[(\w+)\]", text)
    return None if not m or m.group(1) == "none" else m.group(1)


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
    return {"cap_gen": cap_s, "cap_width": cap_w, "gen": sta_s, "width": sta_w,
            "cap": f"Gen{cap_s} x{cap_w}", "now": f"Gen{sta_s} x{sta_w}",
            "degraded": sta_s < cap_s or sta_w < cap_w}


def read_states(host, include=()) -> list[DeviceState]:
    out = []
    for f in select_functions(host, include):
        st = DeviceState(f.bdf, f.kind, f.numa_node)
        problem = config_problem(host, f.bdf)
        if problem:
            st.error, st.unreadable = f"{f.bdf}: {problem}", True
            out.append(st)
            continue
        try:
            regs = read_regs(host, f.bdf)
        except Unreadable as exc:
            st.error, st.unreadable = exc.problem, True
        except NoPcieCap as exc:
            st.error = str(exc)
        else:
            st.devctl = regs["devctl"]
            st.link = link_info(regs["lnkcap"], regs["lnksta"])
        out.append(st)
    return out


def write_argv(host, bdf: str, code: int) -> list[str]:
    """The masked write: only bits 14:12 can change (bit 15 would start an FLR)."""
    return [*setpci_base(host), "-s", bdf, f"CAP_EXP+8.w={code << 12:04x}:{MRRS_MASK:04x}"]


def unit_text(bdfs: list[str], code: int) -> str:
    """Boot-time re-apply: values are lost at reboot (FACTS). Runs after udev has settled the PCI
    devices and before Proxmox starts guests, so the container never sees the default."""
    lines = ["# Managed by gpubox (hwtune pcie): re-applies PCIe MaxReadReq at boot.",
             "[Unit]",
             f"Description=gpubox: PCIe MaxReadReq {mrrs_bytes(code)} on NVIDIA GPU functions",
             "After=systemd-udev-settle.service",
             "Wants=systemd-udev-settle.service",
             "Before=pve-guests.service",
             "", "[Service]", "Type=oneshot", "RemainAfterExit=yes"]
    lines += [f"ExecStart=/usr/bin/setpci -s {b} CAP_EXP+8.w={code << 12:04x}:{MRRS_MASK:04x}" for b in bdfs]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


# -- steps -------------------------------------------------------------------------------------
def _target(ctx) -> int:
    v = ctx.opt("mrrs")
    if v is None:
        v = ctx.box.var("gpubox_pcie_mrrs", 4096)
    return parse_mrrs(v)


def _include(ctx) -> tuple[str, ...]:
    inc = ctx.opt("include") or ()
    items = (inc,) if isinstance(inc, str) else tuple(inc)
    return tuple(p for i in items for p in i.split(","))


def _unit_drift(host, bdfs: list[str], code: int) -> tuple[str | None, str]:
    """(problem or None, wanted text) for the persist unit."""
    want = unit_text(bdfs, code)
    have = host.read_text(UNIT_PATH, default="")
    if have != want:
        return ("boot unit missing" if not have else "boot unit differs"), want
    r = host.run(["systemctl", "is-enabled", UNIT], timeout=30)
    if r.stdout.strip() != "enabled":
        return "boot unit not enabled", want
    return None, want


_diff = unified


class PcieMrrsStep(Step):
    name = "pcie-mrrs"
    title = "PCIe MaxReadReq on GPU functions"
    where = "host"

    def check(self, ctx) -> Finding:
        host, code = ctx.host, _target(ctx)
        states = read_states(host, _include(ctx))
        want = mrrs_bytes(code)
        if not states:
            return Finding.ok("no NVIDIA GPU functions found in sysfs", target=want, devices=[])
        refused = [s for s in states if s.error]
        broken = [s for s in states if s.unreadable]
        if broken:      # refuse every write on this host: a bus problem is not ours to tune around
            return Finding.failed("; ".join(s.error for s in broken),
                                  cause="config space does not read back sanely", repair=UNREADABLE_FIX,
                                  target=want, devices=[s.to_dict() for s in states])
        todo = [s for s in states if s.devctl is not None and (s.devctl & MRRS_MASK) >> 12 != code]
        ev = {"target": want, "devices": [s.to_dict() for s in states]}
        problems = []
        if todo:
            problems.append(", ".join(f"{s.bdf} MaxReadReq {decode_devctl(s.devctl)['mrrs']}" for s in todo)
                            + f" (want {want})")
        persist_problem = None
        if ctx.opt("persist"):
            persist_problem, _ = _unit_drift(host, [s.bdf for s in states if s.devctl is not None], code)
            if persist_problem:
                problems.append(persist_problem)
        if todo or persist_problem:
            mode = lockdown_mode(host) if todo else None
            if mode:
                return Finding.failed(f"{'; '.join(problems)}; kernel lockdown ({mode}) refuses PCI config writes",
                                      cause=f"{LOCKDOWN} says [{mode}]: userspace config-space writes are blocked",
                                      repair="boot without lockdown (disable Secure Boot lockdown / lockdown= on the "
                                             "kernel command line), then re-run", lockdown=mode, **ev)
            return Finding.drift("; ".join(problems), cause="firmware default after reboot" if todo else None,
                                 repair=f"gpubox tune pcie {ctx.box.name}" + (" --persist" if persist_problem else ""),
                                 refused=[s.bdf for s in refused], **ev)
        if refused:
            return Finding.failed("; ".join(s.error for s in refused),
                                  cause="a GPU-class function without a PCI Express capability",
                                  repair="check the device (passthrough quirk, wrong driver); it is left alone", **ev)
        ok = [s for s in states if s.devctl is not None]
        return Finding.ok(f"{len(ok)} function(s) at MaxReadReq {want}"
                          + (" (boot unit enabled)" if ctx.opt("persist") else ""), **ev)

    def plan(self, ctx, finding: Finding) -> Plan:
        host, code = ctx.host, _target(ctx)
        devs = [d for d in finding.evidence["devices"] if d.get("devctl") and d["decoded"]["mrrs_code"] != code]
        cmds, changes = [], []
        for d in devs:
            before = int(d["devctl"], 16)
            after = (before & ~MRRS_MASK) | (code << 12)
            cmds.append(write_argv(host, d["bdf"], code))
            changes.append({"bdf": d["bdf"], "before": before, "after": after,
                            "text": f"{d['bdf']}: DevCtl 0x{before:04x} -> 0x{after:04x} "
                                    f"(MaxReadReq {decode_devctl(before)['mrrs']} -> {mrrs_bytes(code)}, "
                                    f"MaxPayload {decode_devctl(before)['mps']} unchanged)"})
        diff, unit = "", None
        if ctx.opt("persist"):
            bdfs = [d["bdf"] for d in finding.evidence["devices"] if d.get("devctl")]
            problem, want = _unit_drift(host, bdfs, code)
            if problem:
                diff = _diff(UNIT_PATH, host.read_text(UNIT_PATH, default=""), want)
                unit = want
                cmds += [["systemctl", "daemon-reload"], ["systemctl", "enable", UNIT]]
        desc = "; ".join(c["text"] for c in changes) or ""
        if unit:
            desc = (desc + "; " if desc else "") + f"install and enable {UNIT}"
        return Plan(desc, diff, cmds, {"changes": changes, "unit": unit, "code": code})

    def apply(self, ctx, plan: Plan) -> None:
        host, code = ctx.host, plan.data["code"]
        for ch in plan.data["changes"]:
            before = read_regs(host, ch["bdf"])["devctl"]
            host.run(write_argv(host, ch["bdf"], code), timeout=30, check=True)
            after = read_regs(host, ch["bdf"])["devctl"]
            moved = before ^ after
            if moved & ~MRRS_MASK or (after & MRRS_MASK) >> 12 != code:
                raise GpuboxError(f"{ch['bdf']}: DevCtl 0x{before:04x} -> 0x{after:04x}: bits outside 14:12 "
                                  "changed or MaxReadReq did not take", "stop and inspect the device with lspci -vvv")
        if plan.data["unit"]:
            host.write(UNIT_PATH, plan.data["unit"], mode=0o644)
            host.run(["systemctl", "daemon-reload"], timeout=60, check=True)
            host.run(["systemctl", "enable", UNIT], timeout=60, check=True)


class PcieLinkStep(Step):
    """A GPU trained below its capability is a health finding: nothing to tune, reseat/reboot."""

    name = "pcie-link"
    title = "PCIe link speed/width of GPU functions"
    where = "host"

    def check(self, ctx) -> Finding:
        states = [s for s in read_states(ctx.host, _include(ctx)) if s.devctl is not None]
        ev = {"links": {s.bdf: s.link for s in states}}
        narrow = [s for s in states if s.link["width"] < s.link["cap_width"]]
        slow = [s for s in states if s.link["gen"] < s.link["cap_gen"] and s not in narrow]
        if narrow:
            return Finding.failed(
                "; ".join(f"{s.bdf} trained at {s.link['now']}, capable of {s.link['cap']}" for s in narrow),
                cause="link trained below its width (riser/slot/cable, bifurcation setting)",
                repair="reseat or move the GPU, check BIOS slot width/bifurcation, then reboot; not tunable", **ev)
        detail = f"{len(states)} link(s) at full width"
        if states and len({s.link['now'] for s in states}) == 1:
            detail += f" ({states[0].link['now']})"
        if slow:
            # GPUs drop link speed at idle to save power; only width is conclusive without load.
            detail += ("; below max speed now: " + ", ".join(f"{s.bdf} {s.link['now']} (max {s.link['cap']})" for s in slow)
                       + " -- normal at idle, re-check under load")
        return Finding.ok(detail, slow=[s.bdf for s in slow], **ev)

    def apply(self, ctx, plan: Plan) -> None:  # pragma: no cover - check never returns drift
        raise GpuboxError("a degraded link cannot be tuned", "reseat the GPU or fix the slot")
