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
  spaces) and `c 195:* rw # x` (space as third access character) are "Failed to parse device
  rule": lxc logs it and skips the rule, the container starts (seen on the real kernel). A value
  that is an absolute path is a devpath rule (stat()ed on the host).
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


# lxc config/templates/common.conf.in (Debian's /usr/share/lxc/config/common.conf): every container
# starts from this allowlist; userns.conf then clears both lists, and pve-container's
# src/lxc-pve-userns.conf (installed as userns.conf.d/01-pve.conf) allows `a`: a deny-list.
COMMON_RULES = [(DENY, "a"), (ALLOW, "c *:* m"), (ALLOW, "b *:* m")] + [
    (ALLOW, f"c {r} rwm") for r in ("1:3", "1:5", "1:7", "5:0", "5:1", "5:2", "1:8", "1:9", "136:*", "10:229")
]
USERNS_RULES = [(DENY, ""), (ALLOW, ""), (ALLOW, "a")]


def _truthy(v: str) -> bool:
    return str(v).strip().lower() in ("1", "yes", "on", "true")


def _fields(value: str) -> list[str]:
    """Blank-separated fields as lxc splits them: ASCII whitespace only (C isspace), never the
    Unicode separators str.split() also breaks at (U+2028, U+0085, 0x1c...)."""
    return re.split(r"[ \t\n\v\f\r]+", value.strip(" \t\n\v\f\r")) if value.strip(" \t\n\v\f\r") else []


def _devpath_rule(value: str, host_rdev) -> Rule | None:
    """lxc cgfsng.c device_cgroup_rule_parse_devpath: `<path> <access>` (trailing text ignored),
    the path stat()ed on the host: a char/block node becomes its `c|b MAJ:MIN` rule."""
    f = _fields(value)
    if len(f) < 2 or not f[1] or any(ch not in "rwm" for ch in f[1][:3]):
        return None
    rd = host_rdev(f[0])
    if rd is None:
        return None
    return Rule(rd[0], rd[1], rd[2], f[1][:3], True)


def _covers(rule: Rule, kind: str, major: int, minor: int, access: str) -> bool:
    """bpf_program_append_device: a rule matches when the requested access is a subset of its
    access, its type is the node's (or `a`), its major/minor equal (or `*`)."""
    if rule.kind not in ("a", kind):
        return False
    if rule.major not in (None, major) or rule.minor not in (None, minor):
        return False
    return set(access) <= set(rule.access or "rwm")


@dataclass
class StartModel:
    """Devices a container gets at start. Entries are (idx, key, value) of the main section in file
    order (idx is whatever the caller uses to find the line again).

    Checked against the real kernel (tests/fixtures/lxc/corpus, Debian lxc 5.0.2, kernel 6.18):
    - the device list is common.conf's allowlist, for an unprivileged CT (unprivileged: 1 or an
      lxc.idmap line) reset to a deny-list by userns.conf + Proxmox's userns.conf.d; then devN's
      allow rules, then the raw rules in file order; an empty value (`allow =`) clears the earlier
      entries of that key (lxc confile lxc_clear_cgroups);
    - a rule lxc cannot parse is logged and skipped; the container still starts (`skipped`);
    - an empty device list after the last `a` attaches no program: every device is allowed;
    - a non-global `a` rule (`a *:* rwm`) in the program makes the BPF load fail: no start;
    - access is a subset test per rule: `c M:* r` + `c M:* w` does not allow O_RDWR."""

    devn: list[tuple[object, str, str]] = field(default_factory=list)  # (idx, key, path)
    mounts: list[Mount] = field(default_factory=list)
    rules: list[tuple[object, str, str, Rule | None]] = field(default_factory=list)  # (idx, key, value, rule)
    errors: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # rules lxc logs and ignores
    pre: list[Rule] = field(default_factory=list)  # the allow rules pve writes for devN, first
    unprivileged: bool = False
    devn_modes: dict[str, int] = field(default_factory=dict)  # path -> node mode (0o660 default)
    host_rdev: Callable | None = None
    host_exists: Callable | None = None
    host_mode: Callable | None = None
    _list: tuple[bool, list[Rule], bool] | None = None  # (allow_all, kept, program attached)

    @classmethod
    def build(
        cls,
        entries,
        host_rdev: Callable[[str], tuple[str, int, int] | None],
        host_exists: Callable[[str], bool] | None = None,
        host_mode: Callable[[str], int | None] | None = None,
    ) -> "StartModel":
        """host_rdev(path) -> ("c"|"b", major, minor) or None when absent / not a device;
        host_exists(path): anything at that host path (a plain file counts); host_mode(path): its
        permission bits (None: unknown, taken as 0o666)."""
        m = cls()
        if host_exists is None and getattr(host_rdev, "root", None):
            host_exists = host_exists_under(host_rdev.root)  # a plain file exists too
        host_exists = host_exists or (lambda p: host_rdev(p) is not None)
        m.host_rdev, m.host_exists, m.host_mode = host_rdev, host_exists, host_mode
        keys = {k: v for _, k, v in entries}
        m.unprivileged = _truthy(keys.get("unprivileged", "0")) or any(
            k == "lxc.idmap" for _, k, _ in entries
        )
        for _, k, v in entries:
            if k == "lxc.include" and v.strip() and not host_exists(v.strip()):
                m.errors.append(f'Failed to open file "{v.strip()}" (lxc.include): the config does not load')
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
            opts = {a.strip(): b.strip() for a, _, b in (p.partition("=") for p in value.split(",")[1:])}
            deny_write = _truthy(opts.get("deny-write", "0"))
            pre.append(Rule(rd[0], rd[1], rd[2], "r" if deny_write else "rw", True))
            if deny_write:  # update_lxc_config adds `deny = <t> M:m w` too
                pre.append(Rule(rd[0], rd[1], rd[2], "w", False))
            try:
                m.devn_modes[path] = int(opts.get("mode", "0660"), 8)
            except ValueError:
                m.devn_modes[path] = 0o660
        for idx, key, value in entries:
            if key in (ALLOW, DENY):
                rule = None
                if value.strip():
                    if key == ALLOW and value.startswith("/"):
                        rule = _devpath_rule(value, host_rdev)
                    else:
                        rule = parse_rule(key, value)
                    if rule is None:
                        short = key[len("lxc.cgroup2.") :]
                        m.skipped.append(f"Failed to parse device rule {short}={value}")
                m.rules.append((idx, key, value, rule))
            elif key == MOUNT:
                f = _fields(value)
                if len(f) >= 4:
                    m.mounts.append(Mount(idx, f[0], f[1].strip("/"), f[3].split(",")))
        for mt in m.mounts:  # lxc mount_entry: a missing source fails unless `optional`
            if "bind" in mt.opts and "optional" not in mt.opts and not m._src_exists(mt.src):
                m.errors.append(
                    f'No such file or directory - Failed to mount "{mt.src}" on "{ROOTFS}/{mt.target}"'
                )
        for _, _, path in m.devn:  # autodev hook after the mounts: anything at the target -> EEXIST
            rel = path[len("/dev/") :] if path.startswith("/dev/") else path.lstrip("/")
            if m.node(path, with_devn=False)[0] != "absent":
                m.errors.append(f"Could not mknod {ROOTFS}/dev/{rel}: File exists")
        m.pre = pre
        allow_all, kept, attached = m._program(entries)
        if attached and any(k.kind == "a" and not k.is_global for k in kept if k.allow != allow_all):
            m.errors.append("Invalid argument - Failed to load bpf program (an `a` rule with access)")
        return m

    def _src_exists(self, src: str) -> bool:
        """A relative source is resolved against lxc-start's working directory, never the host's
        root: for the container it does not exist (the real start: "Failed to mount")."""
        return src.startswith("/") and self.host_exists(src)

    def _program(self, entries=None) -> tuple[bool, list[Rule], bool]:
        """(allow_all, rules kept, program attached) as lxc builds its cgroup2 device list."""
        if self._list is not None:
            return self._list
        seq: list[tuple[str, Rule | None, str]] = []  # (key, rule, raw value), config-time clears done
        base = USERNS_RULES if self.unprivileged else []
        for key, val in COMMON_RULES + base:
            if not val:
                seq = [e for e in seq if e[0] != key]
                continue
            seq.append((key, parse_rule(key, val), val))
        seq += [(ALLOW if r.allow else DENY, r, "") for r in self.pre]
        for _, key, value, rule in self.rules:
            if not value.strip():
                seq = [e for e in seq if e[0] != key]
                continue
            seq.append((key, rule, value))
        allow_all, kept = False, []
        for _key, r, _ in seq:
            if r is None:  # lxc logs it and goes on
                continue
            if r.is_global:
                allow_all, kept = r.allow, []
                continue
            same = (r.kind, r.major, r.minor, r.access)
            hit = [k for k in kept if (k.kind, k.major, k.minor, k.access) == same]
            if hit:
                hit[0].allow = r.allow  # bpf_list_add_device: an identical rule is flipped
                continue
            kept.append(Rule(r.kind, r.major, r.minor, r.access, r.allow))
        attached = bool(kept)
        program = [k for k in kept if k.allow != allow_all]  # the others are skipped
        self._list = (allow_all, program, attached)
        return self._list

    @property
    def starts(self) -> bool:
        return not self.errors

    def providers(self, path: str) -> list[tuple[str, object]]:
        """How `path` comes to exist in the container: ("devN", idx) / ("mount", idx)."""
        out: list[tuple[str, object]] = [("devN", i) for i, _, p in self.devn if p == path]
        out += [("mount", mt.idx) for mt in self.mounts if mt.provides(path) and "bind" in mt.opts]
        return out

    def list_type_allows_all(self) -> bool:
        allow_all, _, attached = self._program()
        return allow_all or not attached

    def effective(self) -> tuple[bool, list[Rule]]:
        """(allow_all, rules in the program) after bpf_list_add_device's list-type handling."""
        allow_all, kept, attached = self._program()
        return (allow_all or not attached), (kept if attached else [])

    def allow_strings(self) -> list[str]:
        """The effective allow rules in canonical `c M:m acc` form (`a` for a denylist), for the
        simulated container's cgroup state."""
        allow_all, kept = self.effective()
        if allow_all:
            return ["a"]
        star = lambda v: "*" if v is None else str(v)  # noqa: E731
        return [f"{k.kind} {star(k.major)}:{star(k.minor)} {k.access}" for k in kept if k.allow]

    def permitted(self, major: int, minor: int, access: str = "rw", kind: str = "c") -> bool:
        """The cgroup2 bpf program's verdict for an open of device major:minor with `access`."""
        allow_all, kept, attached = self._program()
        if not attached:
            return True
        if allow_all:
            return not any(not k.allow and _covers(k, kind, major, minor, access) for k in kept)
        return any(k.allow and _covers(k, kind, major, minor, access) for k in kept)

    def node(self, path: str, with_devn: bool = True) -> tuple[str, tuple[str, int, int] | None, int | None]:
        """(kind, rdev, mode) of `path` in the container: kind absent|file|dir|node|devN; a node's
        host rdev and mode. Later mounts stack over earlier ones; devN nodes come last (autodev)."""
        if with_devn:
            for _, _, p in self.devn:
                if p == path:
                    return "devN", self.host_rdev(p), self.devn_modes.get(p, 0o660)
        p = path.strip("/")
        got: tuple[str, tuple[str, int, int] | None, int | None] = ("absent", None, None)
        for mt in self.mounts:
            if "bind" not in mt.opts or not mt.provides(p):
                continue
            src = mt.src.rstrip("/") + ("/" + p[len(mt.target) :].lstrip("/") if p != mt.target else "")
            if self._src_exists(mt.src):
                if not self._src_exists(src):
                    continue
                rd = self.host_rdev(src)
                if rd is not None:
                    got = ("node", rd, self.host_mode(src) if self.host_mode else None)
                else:
                    got = ("dir" if self._is_dir(src) else "file", None, None)
            elif p == mt.target and ("create=file" in mt.opts or "create=dir" in mt.opts):
                got = ("file" if "create=file" in mt.opts else "dir", None, None)
        return got

    def _is_dir(self, src: str) -> bool:
        return bool(getattr(self.host_exists, "is_dir", lambda s: False)(src))

    def verdict(self, path: str) -> str:
        """What open() in the container gives, in the words of the real-kernel corpus: absent |
        file | dir | rw | ro | denied | mode (the file mode refused first: an unprivileged CT's root
        is not the owner of a bind-mounted host node, so only its `other` bits count)."""
        kind, rd, mode = self.node(path)
        if kind not in ("node", "devN") or rd is None:
            return kind if kind not in ("node", "devN") else "absent"
        # a devN node is chowned to the CT's mapped uid/gid (create_passthrough_device_node): its
        # root owns it; a bind-mounted host node stays owned by the host's root (unmapped)
        if self.unprivileged and kind == "node" and mode is not None and (mode & 0o006) != 0o006:
            return "mode"
        if self.permitted(rd[1], rd[2], "rw", rd[0]):
            return "rw"
        return "ro" if self.permitted(rd[1], rd[2], "r", rd[0]) else "denied"


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

    rdev.root = root  # type: ignore[attr-defined]  (StartModel.build's default host_exists)
    return rdev


class _Exists:
    """host_exists under a root, with is_dir for the start model's directory sources."""

    def __init__(self, root: str):
        self.root = root

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def __call__(self, path: str) -> bool:
        return os.path.lexists(self._p(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self._p(path))


def host_exists_under(root: str) -> Callable[[str], bool]:
    return _Exists(root)


def host_mode_under(root: str) -> Callable[[str], int | None]:
    def mode(path: str):
        try:
            return os.stat(os.path.join(root, path.lstrip("/"))).st_mode & 0o7777
        except OSError:
            return None

    return mode
