"""What a Proxmox container gets at start, from its main-section lines: which device nodes exist in
its /dev, which the device cgroup permits, and whether the start fails at all.

One model for `check`, `fix` and the simulated `pct start`, written from the sources:
- pve-container 94f5585 src/PVE/LXC.pm update_lxc_config: every devN entry is stat()ed first
  (Tools.pm get_device_mode_and_rdev dies "Device $path does not exist") and becomes
  `lxc.cgroup2.devices.allow = c MAJ:MIN rw`, written *before* the raw `lxc.*` lines of the config.
- lxc e7b855a src/lxc/cgroups/cgfsng.c device_cgroup_rule_parse: a rule is `a` alone (global), or
  type a|b|c, exactly one whitespace, major `*`|digits, `:`, minor `*`|digits, exactly one
  whitespace, then up to three access characters r/w/m; the first three characters after that
  space are read and nothing else, so `c 195:* rwm # nvidia` is valid while `c  195:* rwm` (two
  spaces) and `c 195:* rw # x` (space as third access character) make the start fail with
  "Failed to parse device rule". A value that is an absolute path is a devpath rule.
- lxc src/lxc/cgroups/cgroup2_devices.c bpf_list_add_device: the list starts as an allowlist; a
  global `a` sets allowlist (deny) / denylist (allow) and clears the rules before it; in an
  allowlist specific deny rules are skipped, in a denylist specific allow rules are skipped.
- lxc mounts `lxc.mount.entry` before the autodev hook; lxc-pve-autodev-hook then mknod()s every
  devN path in the rootfs and dies "Could not mknod $root/dev/$dev: $!" (EEXIST when a mount
  entry already put something there): the container does not start (docs/facts.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable

ALLOW = "lxc.cgroup2.devices.allow"
DENY = "lxc.cgroup2.devices.deny"
MOUNT = "lxc.mount.entry"
ROOTFS = "/usr/lib/x86_64-linux-gnu/lxc/rootfs"  # ROOTFS_MOUNT that the hooks see on PVE
# Dynamic char majors: 254 down to 234, then 511 down to 384 (linux fs/char_dev.c).
DYNAMIC_MAJORS = frozenset(range(234, 255)) | frozenset(range(384, 512))
_DEVN = re.compile(r"^dev(\d+)$")


@dataclass
class Rule:
    kind: str  # a | b | c | path
    major: int | None  # None = `*`
    minor: int | None
    access: str
    allow: bool
    is_global: bool = False

    def matches(self, major: int, minor: int) -> bool:
        return self.kind in ("a", "c") and self.major in (None, major) and self.minor in (None, minor)


def _num(val: str, i: int) -> tuple[int | None, int] | None:
    if i < len(val) and val[i] == "*":
        return None, i + 1
    j = i
    while j < len(val) and val[j].isdigit() and j - i < 49:
        j += 1
    if j == i:
        return None
    return int(val[i:j]), j


def parse_rule(key: str, value: str) -> Rule | None:
    """lxc's device_cgroup_rule_parse (+ the devpath form); None where lxc returns -1."""
    allow = key.endswith("allow")
    if value == "a":
        return Rule("a", None, None, "", allow, True)
    if allow and value.startswith("/"):
        return Rule("path", None, None, "rwm", allow)
    if not value or value[0] not in "abc":
        return None
    kind = value[0]
    if len(value) < 2 or not value[1].isspace():
        return None
    r = _num(value, 2)
    if r is None:
        return None
    major, i = r
    if i >= len(value) or value[i] != ":":
        return None
    r = _num(value, i + 1)
    if r is None:
        return None
    minor, i = r
    if i >= len(value) or not value[i].isspace():
        return None
    access = ""
    for ch in value[i + 1 : i + 4]:
        if ch == "\n":
            break
        if ch not in "rwm":
            return None
        access += ch
    return Rule(kind, major, minor, access, allow)


def devn_path(value: str | None) -> str:
    """The path of a devN property string (pve-container Config.pm $dev_desc: `path` is the default key)."""
    for part in (value or "").split(","):
        k, eq, v = part.partition("=")
        if not eq:
            return k.strip()
        if k.strip() == "path":
            return v.strip()
    return ""


@dataclass
class Mount:
    idx: object
    src: str
    target: str  # relative to the rootfs, no leading/trailing slash
    opts: list[str]

    def provides(self, path: str) -> bool:
        t, p = self.target, path.strip("/")
        return p == t or p.startswith(t + "/")


@dataclass
class StartModel:
    """Devices a container gets at start. Entries are (idx, key, value) of the main section in file
    order (idx is whatever the caller uses to find the line again)."""

    devn: list[tuple[object, str, str]] = field(default_factory=list)  # (idx, key, path)
    mounts: list[Mount] = field(default_factory=list)
    rules: list[tuple[object, str, str, Rule | None]] = field(default_factory=list)  # (idx, key, value, rule)
    errors: list[str] = field(default_factory=list)
    pre: list[Rule] = field(default_factory=list)  # the allow rules pve writes for devN, first

    @classmethod
    def build(
        cls,
        entries,
        host_rdev: Callable[[str], tuple[str, int, int] | None],
        host_exists: Callable[[str], bool] | None = None,
    ) -> "StartModel":
        """host_rdev(path) -> ("c"|"b", major, minor) or None when absent / not a device."""
        m = cls()
        host_exists = host_exists or (lambda p: host_rdev(p) is not None)
        pre: list[Rule] = []
        devn = sorted(((i, k, v) for i, k, v in entries if _DEVN.match(k)), key=lambda e: int(e[1][3:]))
        for idx, key, value in devn:
            path = devn_path(value)
            if not path:
                m.errors.append(f"Path is not defined for passthrough device {key}")
                continue
            rd = host_rdev(path)
            if rd is None:
                m.errors.append(f"Device {path} does not exist")
                continue
            m.devn.append((idx, key, path))
            deny_write = "deny-write=1" in value.replace(" ", "")
            pre.append(Rule(rd[0], rd[1], rd[2], "r" if deny_write else "rw", True))
        for idx, key, value in entries:
            if key in (ALLOW, DENY):
                rule = parse_rule(key, value)
                m.rules.append((idx, key, value, rule))
                if rule is None:
                    short = key[len("lxc.cgroup2.") :]
                    m.errors.append(f"Failed to parse device rule {short}={value}")
            elif key == MOUNT:
                f = value.split()
                if len(f) >= 4:
                    m.mounts.append(Mount(idx, f[0], f[1].strip("/"), f[3].split(",")))
        for mt in m.mounts:  # lxc mount_entry: a missing source fails unless `optional`
            if (
                "bind" in mt.opts
                and "optional" not in mt.opts
                and mt.src.startswith("/")
                and not host_exists(mt.src)
            ):
                m.errors.append(
                    f'No such file or directory - Failed to mount "{mt.src}" on "{ROOTFS}/{mt.target}"'
                )
        for _, _, path in m.devn:  # autodev hook after the mounts
            rel = path[len("/dev/") :] if path.startswith("/dev/") else path.lstrip("/")
            for mt in m.mounts:
                hit = mt.target == path.strip("/") or (
                    mt.provides(path) and host_exists(mt.src.rstrip("/") + path[len("/" + mt.target) :])
                )
                if hit:
                    m.errors.append(f"Could not mknod {ROOTFS}/dev/{rel}: File exists")
                    break
        m.pre = pre
        return m

    @property
    def starts(self) -> bool:
        return not self.errors

    def providers(self, path: str) -> list[tuple[str, object]]:
        """How `path` comes to exist in the container: ("devN", idx) / ("mount", idx)."""
        out: list[tuple[str, object]] = [("devN", i) for i, _, p in self.devn if p == path]
        out += [("mount", mt.idx) for mt in self.mounts if mt.provides(path) and "bind" in mt.opts]
        return out

    def list_type_allows_all(self) -> bool:
        allow_all = False
        for _, _, _, r in self.rules:
            if r is not None and r.is_global:
                allow_all = r.allow
        return allow_all

    def effective(self) -> tuple[bool, list[Rule]]:
        """(allow_all, rules kept) after bpf_list_add_device's list-type handling."""
        allow_all = False
        kept: list[Rule] = list(self.pre)
        for _, _, _, r in self.rules:
            if r is None or r.kind == "path":
                continue
            if r.is_global:
                allow_all, kept = r.allow, []
                continue
            if allow_all == r.allow:  # skipped: allow in a denylist, deny in an allowlist
                continue
            same = (r.kind, r.major, r.minor, r.access)
            kept = [k for k in kept if (k.kind, k.major, k.minor, k.access) != same]
            kept.append(r)
        return allow_all, kept

    def allow_strings(self) -> list[str]:
        """The effective allow rules in canonical `c M:m acc` form (`a` for a denylist), for the
        simulated container's cgroup state."""
        allow_all, kept = self.effective()
        if allow_all:
            return ["a"]
        star = lambda v: "*" if v is None else str(v)  # noqa: E731
        return [f"{k.kind} {star(k.major)}:{star(k.minor)} {k.access}" for k in kept if k.allow]

    def permitted(self, major: int, minor: int) -> bool:
        """The cgroup2 bpf program's verdict for read+write on char device major:minor."""
        allow_all, kept = self.effective()
        if allow_all:
            return not any(
                not k.allow and k.matches(major, minor) and ("r" in k.access or "w" in k.access) for k in kept
            )
        rd = any(k.allow and k.matches(major, minor) and "r" in k.access for k in kept)
        wr = any(k.allow and k.matches(major, minor) and "w" in k.access for k in kept)
        return rd and wr


def host_rdev_under(root: str) -> Callable[[str], tuple[str, int, int] | None]:
    """host_rdev for a host whose files live under `root` (tests, the simulated box)."""
    import stat as _st

    def rdev(path: str):
        try:
            st = os.stat(os.path.join(root, path.lstrip("/")))
        except OSError:
            return None
        if _st.S_ISCHR(st.st_mode):
            return "c", os.major(st.st_rdev), os.minor(st.st_rdev)
        if _st.S_ISBLK(st.st_mode):
            return "b", os.major(st.st_rdev), os.minor(st.st_rdev)
        return None

    return rdev
