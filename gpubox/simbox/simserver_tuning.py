"""The simulated box's tuning state as the simulated server sees it at start: the GPUs' PCIe
MaxReadReq (sysfs config space), kernel.numa_balancing, the NCCL variables from its environment and
NCCL's config files, and how much each untuned knob slows decoding. A SIMULATOR's model.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

# -- the tuning state and its effect (docs/facts.md "Reference figures") ---------------------------------------
# On the seed box, tuning (NCCL variables + MaxReadReq 4096 + NUMA balancing off) gave +7.5% single
# stream (DDTree b15, 256 tok) and +18.5% under concurrency. The seed measured the three together,
# so there is no figure per knob: each gets an equal third of the log-gain (an assumption, stated in
# docs/bench.md). NCCL and MRRS act only at TP>1 (TP1 has no collective traffic; at batch 1 MRRS
# hardly touches host-device copies); NUMA balancing (page-migration faults on the threads that
# drive the GPUs) acts at every TP, as stalls.
TUNING_GAIN_SINGLE = 1.075
TUNING_GAIN_C8 = 1.185
TUNING_WEIGHT = {"nccl": 1 / 3, "mrrs": 1 / 3, "numa": 1 / 3}
NUMA_STALL_P = 0.25  # share of decode steps that hit a NUMA-balancing stall
MRRS_TUNED = 4096
# What pays on the seed's PCIe 2-NUMA hardware (hwtune/profiles/pcie-2numa.yaml): the hardware's
# truth, so the simulator does not read the profile it is judging.
NCCL_TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MIN_CTAS": "8"}
NCCL_ALIASES = {
    "NCCL_MIN_CTAS": ("NCCL_MIN_NCHANNELS",)
}  # deprecated since 2.17 (docs/facts.md "NCCL environment")
NCCL_TOKENS = {
    "NCCL_ALGO": {"ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"},
    "NCCL_PROTO": {"ll", "ll128", "simple"},
}
PCI_DEVICES = "sys/bus/pci/devices"
NUMA_SYSCTL = "proc/sys/kernel/numa_balancing"


def read_devctl(config: bytes) -> int | None:
    """DevCtl (CAP_EXP+8) from raw config space: walk the capability list from 0x34 to the PCI
    Express capability (id 0x10). Parsed here rather than with hwtune.pcie so the simulator stays
    a stdlib-only process that reads exactly the bytes the kernel would hand out."""
    if len(config) < 0x40:
        return None
    ptr, seen = config[0x34] & 0xFC, set()
    while ptr and ptr not in seen and ptr + 10 <= len(config):
        seen.add(ptr)
        if config[ptr] == 0x10:
            return struct.unpack_from("<H", config, ptr + 8)[0]
        ptr = config[ptr + 1] & 0xFC
    return None


def gpu_functions(host_root: Path) -> list[tuple[str, int | None]]:
    """(BDF, MaxReadReq bytes or None) of the NVIDIA GPU functions (class 0300/0302, never the
    audio function; docs/facts.md "PCIe Device Control"), in nvidia-smi order (PCI bus id)."""
    out = []
    base = host_root / PCI_DEVICES
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        try:
            vendor = (d / "vendor").read_text().strip().lower()
            klass = (d / "class").read_text().strip().lower().removeprefix("0x").rjust(6, "0")
        except OSError:
            continue
        if vendor != "0x10de" or klass[:4] not in ("0300", "0302"):
            continue
        try:
            word = read_devctl((d / "config").read_bytes())
        except OSError:
            word = None
        code = None if word is None else (word & 0x7000) >> 12  # bits 14:12, 128 << n; 6, 7 reserved
        out.append((d.name, 128 << code if code is not None and code <= 5 else None))
    return out


def _conf_file(path: Path) -> dict[str, str]:
    """NCCL's KEY=VALUE config file (src/misc/param.cc): '#' comments, blank lines skipped."""
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out.setdefault(k.strip(), v.strip())
    return out


def nccl_settings(env: dict[str, str], root: Path | None) -> dict[str, tuple[str, str]]:
    """name -> (value, source) as NCCL itself sees them: the process environment wins, then
    $NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf (docs/facts.md "NCCL environment"); files are
    read inside the server's root."""
    out = {k: (v, "environment") for k, v in env.items() if k.startswith("NCCL_")}
    if root is None:
        return out
    user = env.get("NCCL_CONF_FILE") or "/root/.nccl.conf"  # the server runs as root in the CT
    for logical in (user, "/etc/nccl.conf"):
        for k, v in _conf_file(root / logical.lstrip("/")).items():
            if k.startswith("NCCL_") and k not in out:
                out[k] = (v, logical)
    return out


def nccl_fatal(settings: dict[str, tuple[str, str]]) -> str | None:
    """NCCL rejects bad NCCL_ALGO/NCCL_PROTO tokens at init (docs/facts.md "NCCL environment"); a misspelled name is ignored."""
    for name, allowed in NCCL_TOKENS.items():
        if name not in settings:
            continue
        value, source = settings[name]
        if ";" in value or ":" in value:  # per-collective syntax: not modelled, accepted
            continue
        for tok in value.split(","):
            t = tok.strip().lstrip("^").lower()
            if t and t not in allowed:
                return f"{name}={value} (from {source}): unknown token {tok.strip()!r}"
    return None


def _nccl_tuned(name: str, settings: dict[str, tuple[str, str]]) -> bool:
    want = NCCL_TUNED[name]
    for n in (name, *NCCL_ALIASES.get(name, ())):
        if n in settings:
            value = settings[n][0].strip()
            if name == "NCCL_MIN_CTAS":
                try:
                    return int(value, 0) >= int(want)
                except ValueError:
                    return False
            return value.lower() == want.lower()
    return False


@dataclass
class Tuning:
    """What the simulator saw at start, and how untuned each knob is (0 = tuned, 1 = the seed's
    untuned state; MRRS scales with log2(4096/MRRS) / 3, so 512 bytes = 1)."""

    modelled: bool = False
    tp: int = 1
    gpus: list[dict] = field(default_factory=list)
    numa_balancing: str | None = None
    nccl: dict[str, dict] = field(default_factory=dict)
    nccl_fatal: str | None = None
    severity: dict[str, float] = field(default_factory=lambda: {"nccl": 0.0, "mrrs": 0.0, "numa": 0.0})
    notes: list[str] = field(default_factory=list)

    def weight(self, parts=("nccl", "mrrs", "numa")) -> float:
        """Sum of the untuned knobs' shares; NCCL and MRRS count only at TP>1."""
        w = 0.0
        for k in parts:
            if k in ("nccl", "mrrs") and self.tp <= 1:
                continue
            w += TUNING_WEIGHT[k] * self.severity[k]
        return w

    def factor(self, active: int, parts=("nccl", "mrrs", "numa")) -> float:
        """Decode-rate multiplier with `active` concurrent streams: the seed's gain, log-interpolated
        from single stream (1.075) to C=8 (1.185), raised to the untuned share."""
        x = min(max(active - 1, 0), 7) / 7
        ln_gain = math.log(TUNING_GAIN_SINGLE) + (math.log(TUNING_GAIN_C8) - math.log(TUNING_GAIN_SINGLE)) * x
        return math.exp(-ln_gain * self.weight(parts))

    def to_dict(self) -> dict:
        return {
            "simulated": True,
            "modelled": self.modelled,
            "tp": self.tp,
            "gpus": self.gpus,
            "numa_balancing": self.numa_balancing,
            "nccl": self.nccl,
            "nccl_fatal": self.nccl_fatal,
            "severity": self.severity,
            "notes": self.notes,
            "factor_single_stream": round(self.factor(1), 4),
            "factor_c8": round(self.factor(8), 4),
        }

    def summary(self) -> str:
        if not self.modelled:
            return "not modelled (no --host-root): decode rates are the tuned seed's"
        mrrs = ",".join(f"{g['index']}:{g['mrrs'] or '?'}" for g in self.gpus) or "no GPU functions"
        nccl = " ".join(f"{k}={'ok' if v['tuned'] else 'untuned'}" for k, v in self.nccl.items())
        return (
            f"tp={self.tp} MaxReadReq[{mrrs}] numa_balancing={self.numa_balancing} {nccl} -> decode "
            f"x{self.factor(1):.3f} single stream, x{self.factor(8):.3f} at C=8"
        )


def read_tuning(tp: int, env: dict[str, str], host_root: str | None, root: str | None) -> Tuning:
    """The tuning state from the files gpubox tunes: <host_root>/sys/bus/pci/devices/*/config
    (MRRS of the GPUs in CUDA_VISIBLE_DEVICES), <host_root>/proc/sys/kernel/numa_balancing, and the
    NCCL settings of this process (environment over <root>'s NCCL config files)."""
    t = Tuning(tp=tp)
    if not host_root:
        return t
    t.modelled = True
    hroot = Path(host_root)
    funcs = gpu_functions(hroot)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    try:
        idx = [int(x) for x in visible.split(",") if x.strip()] if visible else list(range(tp))
    except ValueError:
        t.notes.append(f"CUDA_VISIBLE_DEVICES={visible!r} is not a list of indices; using 0..{tp - 1}")
        idx = list(range(tp))
    for i in idx[: max(tp, 1)]:
        if i < len(funcs):
            t.gpus.append({"index": i, "bdf": funcs[i][0], "mrrs": funcs[i][1]})
        else:
            t.notes.append(f"GPU {i} has no PCI function under {hroot / PCI_DEVICES}")
    known = [g["mrrs"] for g in t.gpus if g["mrrs"]]
    if known:  # a collective waits for the slowest member: the worst GPU of the group counts
        t.severity["mrrs"] = max(0.0, math.log2(MRRS_TUNED / min(known)) / 3)
    try:
        t.numa_balancing = (hroot / NUMA_SYSCTL).read_text().strip()
    except OSError:
        t.numa_balancing = None  # kernel without CONFIG_NUMA_BALANCING: nothing scans
    try:  # bit 0 = NUMA_BALANCING_NORMAL; 2 (memory tiering) only promotes from slow tiers
        t.severity["numa"] = 1.0 if t.numa_balancing and int(t.numa_balancing) & 1 else 0.0
    except ValueError:
        t.notes.append(f"numa_balancing={t.numa_balancing!r} is not a number")
    settings = nccl_settings(env, Path(root) if root else None)
    t.nccl = {
        k: {
            "value": settings.get(k, (None, None))[0],
            "source": settings.get(k, (None, None))[1],
            "tuned": _nccl_tuned(k, settings),
        }
        for k in NCCL_TUNED
    }
    for k in NCCL_TUNED:
        for alias in NCCL_ALIASES.get(k, ()):
            if k not in settings and alias in settings:
                t.nccl[k].update(value=settings[alias][0], source=f"{settings[alias][1]} ({alias})")
    t.severity["nccl"] = sum(not v["tuned"] for v in t.nccl.values()) / len(NCCL_TUNED)
    t.nccl_fatal = nccl_fatal(settings)
    return t
