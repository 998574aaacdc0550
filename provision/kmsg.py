"""What the host's kernel log says about the GPUs: Xid events and corrected error counts, this boot
and the one before (a GPU lost before a reboot is in the previous boot's log).

The NVIDIA driver reports GPU errors as `NVRM: Xid (PCI:DDDD:BB:DD): N, ...` lines (NVIDIA's Xid
catalog); a GPU found gone at probe time gets `NVRM: The NVIDIA GPU DDDD:BB:DD.F ... has fallen off
the bus` without an Xid line (NVIDIA/NVSentinel#155). The PCIe AER driver logs each corrected link
error as `... PCIe Bus Error: severity=Corrected` ("Correctable" since Linux 6.x) on the device
that saw it; EDAC counts the host's corrected memory errors ("EDAC MC0: 1 CE ..."). The probe's
own XID watch sees only its few seconds; these lines are the history before it: a GPU that fell
off the bus, a link that was retrying for hours (wilicc/gpu-burn#1: corrected link errors on the
GPU's port, then Xid 79), memory errors whose row remaps wait for a reset.

Read with `journalctl -k -b 0|-1` (the last LINES lines of each boot; `dmesg` when there is no
journal), parsed here purely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpubox.facts import Fact

LINES = 50000  # of each boot's kernel log: bounded output whatever the host logged
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\): (\d+),\s*(.*)")
_GONE = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\.\d")
_FALLEN = re.compile(r"fallen off the bus")
_AER = re.compile(r"(\S+) (\S+): (?:AER: )?PCIe Bus Error: severity=(Correct(?:ed|able)|Uncorrect)")
_EDAC = re.compile(r"EDAC \S+: (\d+) CE ")

# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): what each class says about the GPU.
BUS = {79: "GPU has fallen off the bus"}
MEMORY = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remap recorded",
    64: "ECC page retirement or row remap failed",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    140: "unrecovered ECC error",
}
LINK = {74: "NVLink error", **{n: "NVLink error" for n in range(144, 151)}}
FIRMWARE = {
    62: "internal micro-controller halt",
    119: "GSP RPC timeout",
    120: "GSP error",
    143: "GPU initialization failure",
    154: "GPU recovery action required",
}
HARDWARE = {**BUS, **MEMORY, **LINK, **FIRMWARE}
APPLICATION = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
}


@dataclass
class XidCount:
    bus: str  # DDDD:BB:DD, as the driver names the GPU
    xid: int
    count: int = 0
    boot: str = "this boot"  # or "previous boot"
    first: str = ""  # the first line's text after the Xid number
    stamp: str = ""  # the first line's time stamp, as logged
    probe: bool = False  # found gone at the driver's probe: no Xid line, counted as 79


@dataclass
class KmsgFacts:
    boots: dict[str, str] | None = None  # "this boot" / "previous boot" -> kernel log text; None: unread
    source: str = ""  # what was read (journalctl / dmesg)


@dataclass
class KmsgSummary:
    xids: list[XidCount] = field(default_factory=list)
    corrected: dict[str, int] = field(default_factory=dict)  # device -> corrected PCIe errors
    uncorrected: dict[str, int] = field(default_factory=dict)  # device -> uncorrected PCIe errors
    edac_ce: int = 0  # the host's corrected memory errors


def summarize(boots: dict[str, str]) -> KmsgSummary:
    """Pure: Xids per (boot, GPU, number), corrected PCIe errors per device, EDAC CE total."""
    out = KmsgSummary()
    seen: dict[tuple[str, str, int], XidCount] = {}
    for boot, text in boots.items():
        pending: str | None = None  # a "The NVIDIA GPU ..." message spans lines
        for line in text.splitlines():
            if "NVRM:" not in line:
                pending = None
            m = _XID.search(line)
            gone = _GONE.search(line)
            if gone:
                pending = gone.group(1).lower()
            if pending and _FALLEN.search(line) and not m:
                m_bus, xid, rest = pending, 79, PROBE
                pending = None
            elif m:
                m_bus, xid, rest = m.group(1).lower(), int(m.group(2)), m.group(3).strip()
            else:
                a = _AER.search(line)
                if a:
                    d = out.uncorrected if a.group(3) == "Uncorrect" else out.corrected
                    d[a.group(2)] = d.get(a.group(2), 0) + 1
                e = _EDAC.search(line)
                if e:
                    out.edac_ce += int(e.group(1))
                continue
            key = (boot, m_bus, xid)
            if key not in seen:
                stamp = line[: line.find("NVRM:")].replace(" kernel:", "").strip()[:40]
                seen[key] = XidCount(m_bus, xid, 0, boot, rest[:160], stamp, rest == PROBE)
                out.xids.append(seen[key])
            seen[key].count += 1
    return out


PROBE = "GPU has fallen off the bus (found gone at the driver's probe, no Xid line)"


def _name(xid: int) -> str:
    return HARDWARE.get(xid) or APPLICATION.get(xid) or "not judged here"


def _shown(x: XidCount) -> str:
    if x.probe:
        return f"{x.bus} fell off the bus, found at the driver's probe (no Xid line; as Xid 79, {x.boot})"
    return f"Xid {x.xid} x{x.count} on {x.bus} ({_name(x.xid)}, {x.boot})"


def decide(f: KmsgFacts) -> tuple[str, str, str | None, str | None]:
    """Pure: (status, detail, cause, repair)."""
    if f.boots is None:
        return "skipped", "the kernel log could not be read (journalctl, dmesg)", None, None
    s = summarize(f.boots)
    parts = [_shown(x) for x in sorted(s.xids, key=lambda x: (x.xid not in HARDWARE, x.boot, x.bus, x.xid))]
    if s.corrected:
        parts.append(
            "corrected PCIe errors: " + ", ".join(f"{d} x{n}" for d, n in sorted(s.corrected.items()))
        )
    if s.uncorrected:
        parts.append(
            "uncorrected PCIe errors: " + ", ".join(f"{d} x{n}" for d, n in sorted(s.uncorrected.items()))
        )
    if s.edac_ce:
        parts.append(f"{s.edac_ce} corrected host memory error(s) (EDAC)")
    hw = [x for x in s.xids if x.xid in HARDWARE]
    shown = "; ".join(parts)
    if not hw:
        what = ", ".join(f.boots)
        return (
            "ok",
            (f"no hardware Xid in the kernel log ({what})" + (f": {shown}" if shown else "")),
            None,
            None,
        )
    causes, repairs = [], []
    if any(x.xid in BUS for x in hw):
        causes.append(
            "a GPU dropped off the PCI bus (power, heat, seating or a failing link"
            + ("; corrected link errors were logged before it" if s.corrected else "")
            + ")"
        )
        repairs.append(
            "reseat the GPU and its power cables, check the PSU, the slot/riser and temperatures; a "
            "reboot brings it back only until it falls off again"
        )
    if any(x.xid in MEMORY for x in hw):
        causes.append("GPU memory errors (ECC)")
        repairs.append(
            "drain the GPU and reset it (nvidia-smi -r -i <gpu> on the host, or reboot) so pending "
            "row remaps and retired pages take effect; if they come back, replace the GPU (RMA)"
        )
    if any(x.xid in LINK for x in hw):
        causes.append("NVLink errors")
        repairs.append(
            "nvidia-smi nvlink --status and the fabric manager's log on the host; reseat or replace "
            "the NVLink bridge or board"
        )
    if any(x.xid in FIRMWARE for x in hw):
        causes.append("driver firmware (GSP) or GPU initialization errors")
        repairs.append("reset the GPU or reboot; update the driver if they return")
    return (
        "failed",
        shown,
        "; ".join(causes) + " (NVIDIA's Xid catalog)",
        "; ".join(repairs),
    )


class KmsgFact(Fact):
    """This boot's and the previous boot's kernel log (journalctl -k, LINES lines each; dmesg
    when journalctl cannot answer for this boot). Only what the host's own tools print is read."""

    @staticmethod
    def read(host) -> KmsgFacts:
        boots: dict[str, str] = {}
        base = ["journalctl", "-k", "-o", "short-iso", "--no-pager", "-q", "-n", str(LINES)]
        for name, b in (("this boot", "0"), ("previous boot", "-1")):
            r = host.run([*base, "-b", b], timeout=60)
            if r.rc == 0:
                boots[name] = r.stdout
        if "this boot" in boots:
            return KmsgFacts(boots, "journalctl -k")
        r = host.run(["dmesg", "--time-format", "iso"], timeout=60)
        if r.rc == 0:
            return KmsgFacts({"this boot": "\n".join(r.stdout.splitlines()[-LINES:])}, "dmesg")
        return KmsgFacts(None)
