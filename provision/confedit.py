"""Compare a container config's main section with the NVIDIA devices the host offers, and build
the smallest edit that makes them agree.

Only the main section counts: raw `lxc.*` lines in `[pve:pending]` or snapshot sections are
never used at start (FACTS.md "Proxmox LXC config"), so they are neither checked nor edited.
Two strategies (`gpubox_device_mode`): `cgroup2` (allow rules + bind mount entries, default)
and `devN` (PVE >= 8.1: `devN: /dev/...` entries, major:minor read at every start).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpubox.diffs import unified

from .devices import HostDevices
from .lxcconf import Line, LxcConf, Section, format_line

ALLOW = "lxc.cgroup2.devices.allow"
DENY = "lxc.cgroup2.devices.deny"
MOUNT = "lxc.mount.entry"
V1_DEVICES = ("lxc.cgroup.devices.allow", "lxc.cgroup.devices.deny")
MODES = ("cgroup2", "devN")
_RULE = re.compile(r"^([abc])\s+(\*|\d+):(\*|\d+)(?:\s+([rwm]+))?$")
_DEVN = re.compile(r"^dev(\d+)$")
# Nodes nvidia-modprobe creates 0666 (NVIDIA/nvidia-modprobe nvidia-modprobe-utils.c NV_DEVICE_FILE_MODE).
# A devN node in the container is 0660 root:root unless `mode=` says otherwise (pve-container
# LXC.pm create_passthrough_device_node), which would lock non-root CUDA users out: say 0666.
_DEVN_0666 = re.compile(r"^/dev/(nvidia\d+|nvidiactl|nvidia-modeset|nvidia-uvm|nvidia-uvm-tools)$")


def devn_path(value: str | None) -> str:
    """The path of a devN property string (`[path=]/dev/x[,mode=..][,uid=..][,gid=..][,deny-write=..]`,
    pve-container Config.pm $dev_desc: `path` is the default key)."""
    for part in (value or "").split(","):
        k, eq, v = part.partition("=")
        if not eq:
            return k.strip()
        if k.strip() == "path":
            return v.strip()
    return ""


def devn_value(path: str) -> str:
    return f"{path},mode=0666" if _DEVN_0666.match(path) else path


@dataclass
class Rule:
    kind: str
    major: int | None  # None = any
    minor: int | None
    access: str

    @classmethod
    def parse(cls, value: str) -> "Rule | None":
        v = value.strip()
        if v == "a":
            return cls("a", None, None, "rwm")
        m = _RULE.match(v)
        if not m:
            return None
        ma = None if m.group(2) == "*" else int(m.group(2))
        mi = None if m.group(3) == "*" else int(m.group(3))
        return cls(m.group(1), ma, mi, m.group(4) or "rwm")

    @property
    def broad(self) -> bool:
        """Allows every char device (`a`, `c *:* ...`, `a *:* ...`)."""
        return self.kind == "a" or (self.major is None and self.kind in ("a", "c"))

    def covers(self, major: int, minor: int) -> bool:
        return (self.kind in ("a", "c") and self.major in (None, major) and self.minor in (None, minor)
                and "r" in self.access and "w" in self.access)


def rule_text(major: int) -> str:
    return f"c {major}:* rwm"


def mount_text(path: str) -> str:
    # `optional`: a node missing on the host must not stop the start; `create=file` makes the
    # mount point (and its parent directories) inside the container.
    return f"{path} {path.lstrip('/')} none bind,optional,create=file"


@dataclass
class Issue:
    kind: str  # stale-rule | missing-rule | missing-mount | duplicate | conflict | cgroup-v1 | over-broad | missing-devN | redundant | devN-node-missing
    text: str
    fixable: bool = True


@dataclass
class Review:
    issues: list[Issue]
    old: str
    new: str
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.new != self.old

    def diff(self, path: str) -> str:
        return unified(path, self.old, self.new)


def _mount_fields(value: str) -> tuple[str, str, str] | None:
    f = value.split()
    if len(f) < 4:
        return None
    return f[0], f[1], f[3]


def _good_mount(f) -> bool:
    opts = f[2].split(",") if f else []
    return "bind" in opts and "optional" in opts


def _covered_by_mount(path: str, mounts: list[tuple[str, str, str]]) -> bool:
    for src, tgt, _ in mounts:
        if src == path and tgt.strip("/") == path.strip("/"):
            return True
        if path.startswith(src.rstrip("/") + "/") and tgt.strip("/") == src.strip("/"):  # a directory bind
            return True
    return False


def _is_nvidia_path(p: str) -> bool:
    return p.startswith("/dev/nvidia")


def review(conf: LxcConf, hd: HostDevices, mode: str = "cgroup2") -> Review:
    """Issues in the main section and the edited text (identical text when nothing to change)."""
    if mode not in MODES:
        from gpubox.errors import GpuboxError
        raise GpuboxError(f"gpubox_device_mode {mode!r} is not known", "use cgroup2 or devN")
    old = conf.render()
    lines = conf.main.lines
    eq = conf.eq_style()
    issues: list[Issue] = []
    warnings: list[str] = []
    drop: set[int] = set()
    replace: dict[int, Line] = {}
    nv_majors = set(hd.nvidia_majors().values())
    in_use = hd.majors_in_use()  # major -> name

    # 1. duplicates (identical key and value; the first stays)
    seen: set[tuple[str, str]] = set()
    for i, l in enumerate(lines):
        if l.key is None:
            continue
        k = (l.key, (l.value or "").strip())
        if k in seen and (l.is_lxc or _DEVN.match(l.key)):
            drop.add(i)
            issues.append(Issue("duplicate", f"duplicate line `{l.raw.strip()}`"))
        seen.add(k)

    # 2. cgroup v1 lines: devices.* become cgroup2 (same syntax); others only warned about
    for i, l in enumerate(lines):
        if i in drop or not (l.key or "").startswith("lxc.cgroup."):
            continue
        if l.key in V1_DEVICES:
            new_key = l.key.replace("lxc.cgroup.", "lxc.cgroup2.")
            if (new_key, (l.value or "").strip()) in seen:
                drop.add(i)
            else:
                replace[i] = format_line(new_key, l.value or "", l.eq)
                seen.add((new_key, (l.value or "").strip()))
            issues.append(Issue("cgroup-v1", f"cgroup v1 line `{l.raw.strip()}` (ignored on cgroup v2, gone in PVE 9)"))
        else:
            warnings.append(f"cgroup v1 line `{l.raw.strip()}` has no effect on cgroup v2: convert it by hand")

    def cur(i: int) -> Line:
        return replace.get(i, lines[i])

    # 3. rules: over-broad, stale, conflicting denies
    rules: list[tuple[int, Rule]] = []
    slots: list[int] = []  # positions of dropped rules, reused for new ones (smallest diff)
    for i in range(len(lines)):
        l = cur(i)
        if i in drop or l.key not in (ALLOW, DENY):
            continue
        r = Rule.parse(l.value or "")
        if r is None:
            continue
        if l.key == DENY:
            if r.kind in ("a", "c") and (r.major is None or r.major in nv_majors):
                drop.add(i)
                slots.append(i)
                issues.append(Issue("conflict", f"`{l.raw.strip()}` denies an NVIDIA device the container needs"))
            continue
        if r.broad:
            drop.add(i)
            slots.append(i)
            issues.append(Issue("over-broad", f"over-broad rule `{l.raw.strip()}` allows every device"))
            continue
        if r.kind == "c" and r.major is not None and not hd.registered(r.major):
            drop.add(i)
            slots.append(i)
            now = f"nvidia-uvm is now {hd.uvm}" if hd.uvm is not None else "nvidia-uvm is not loaded yet"
            issues.append(Issue("stale-rule", f"`{l.raw.strip()}` names major {r.major}, which /proc/devices "
                                              f"no longer lists ({now}): stale"))
            continue
        if mode == "devN" and r.major in nv_majors:
            drop.add(i)
            slots.append(i)
            issues.append(Issue("redundant", f"`{l.raw.strip()}` is redundant with devN entries"))
            continue
        rules.append((i, r))

    # 4. mount entries: conflicts (same target, different source/options), devN redundancy
    mounts: list[tuple[int, tuple[str, str, str]]] = []
    by_target: dict[str, int] = {}
    for i in range(len(lines)):
        l = cur(i)
        if i in drop or l.key != MOUNT:
            continue
        f = _mount_fields(l.value or "")
        if f is None:
            continue
        if mode == "devN" and _is_nvidia_path(f[0]):
            drop.add(i)
            issues.append(Issue("redundant", f"`{l.raw.strip()}` is redundant with devN entries"))
            continue
        t = f[1].strip("/")
        if t in by_target:
            j = by_target[t]
            # keep the entry in the recommended shape (bind,optional); drop the other
            keep_new = _good_mount(f) and not _good_mount(_mount_fields(cur(j).value or ""))
            loser = j if keep_new else i
            issues.append(Issue("conflict", f"`{cur(loser).raw.strip()}` mounts onto {t} like another line "
                                            "with another source/options"))
            drop.add(loser)
            if keep_new:
                mounts[:] = [(k, g) for k, g in mounts if k != j]
                by_target[t] = i
                mounts.append((i, f))
            continue
        by_target[t] = i
        mounts.append((i, f))

    add_rules: list[Line] = []
    add_mounts: list[Line] = []
    add_devn: list[Line] = []
    nodes = hd.pass_nodes()
    if mode == "cgroup2":
        for major, name in in_use.items():
            minors = [(n.want or n.have)[1] for n in nodes if (n.want or n.have) and (n.want or n.have)[0] == major]
            if all(any(r.covers(major, mi) for _, r in rules) for mi in minors):
                continue
            add_rules.append(format_line(ALLOW, rule_text(major), eq))
            issues.append(Issue("missing-rule", f"no `{ALLOW}` rule allows {name} (major {major})"))
        mlist = [f for _, f in mounts]
        for n in nodes:
            if not _covered_by_mount(n.path, mlist):
                add_mounts.append(format_line(MOUNT, mount_text(n.path), eq))
                issues.append(Issue("missing-mount", f"no `{MOUNT}` for {n.path}"))
    else:
        used = {int(m.group(1)) for l in lines if l.key and (m := _DEVN.match(l.key))}
        have_paths = {}
        for i, l in enumerate(lines):
            if l.key and _DEVN.match(l.key) and i not in drop:
                have_paths[devn_path(l.value)] = l.key
        k = 0
        for n in nodes:
            if n.path in have_paths:
                if not n.present:
                    issues.append(Issue("devN-node-missing", f"{have_paths[n.path]}: {n.path} is missing on the host: "
                                                             "the container will not start", fixable=False))
                continue
            while k in used:
                k += 1
            used.add(k)
            add_devn.append(format_line(f"dev{k}", devn_value(n.path)))
            issues.append(Issue("missing-devN", f"no devN entry for {n.path}"))

    new_lines = _assemble(lines, drop, replace, slots, add_rules, add_mounts, add_devn)
    new_conf = LxcConf([Section(conf.main.name, conf.main.header, new_lines), *conf.sections[1:]])
    return Review(issues, old, new_conf.render(), warnings)


def _assemble(lines, drop, replace, slots, add_rules, add_mounts, add_devn) -> list[Line]:
    """Apply drops/replacements and put new lines next to their kin (else after the last line)."""
    add_rules = list(add_rules)
    slot_fill: dict[int, Line] = {}
    for i in sorted(slots):
        if add_rules:
            slot_fill[i] = add_rules.pop(0)
    last_content = max((i for i, l in enumerate(lines) if not l.blank), default=-1)
    last_of = lambda pred: max((i for i, l in enumerate(lines) if pred(l)), default=None)  # noqa: E731
    after: dict[int, list[Line]] = {}
    rule_anchor = last_of(lambda l: l.key in (ALLOW, DENY, *V1_DEVICES))
    mount_anchor = last_of(lambda l: l.key == MOUNT)
    devn_anchor = last_of(lambda l: bool(l.key and _DEVN.match(l.key)))
    lxc_anchor = last_of(lambda l: l.is_lxc)
    if add_rules:
        after.setdefault(rule_anchor if rule_anchor is not None else (lxc_anchor if lxc_anchor is not None else last_content), []).extend(add_rules)
    if add_mounts:
        a = mount_anchor if mount_anchor is not None else (rule_anchor if rule_anchor is not None else last_content)
        after.setdefault(a, []).extend(add_mounts)
    if add_devn:
        a = devn_anchor if devn_anchor is not None else last_content
        after.setdefault(a, []).extend(add_devn)
    out: list[Line] = list(after.get(-1, []))
    for i, l in enumerate(lines):
        if i in slot_fill:
            out.append(slot_fill[i])
        elif i not in drop:
            out.append(replace.get(i, l))
        extra = after.get(i)
        if extra:
            if out and not out[-1].raw.endswith("\n"):
                out[-1] = Line(out[-1].raw + "\n", out[-1].key, out[-1].value, out[-1].eq)
            out.extend(extra)
    return out
