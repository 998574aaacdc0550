"""Compare a container config's main section with the NVIDIA devices the host offers, and build
the smallest edit that makes them agree.

One module (about 740 lines): the review's reading of a config, its rules and the edit it builds are
one decision, tested as data.

Only the main section counts: raw `lxc.*` lines in `[pve:pending]` or snapshot sections are
never used at start (docs/facts.md "Proxmox LXC config"), so they are neither checked nor edited.
Two ways to pass a node: `devN: /dev/...` (PVE >= 8.1, major:minor read at every start) or an
allow rule + bind mount entry (`cgroup2`). Each node is passed the way the config already passes
NVIDIA nodes, never both ways; `gpubox_device_mode` decides only for configs that pass none
(`devN` set explicitly also converts NVIDIA mount entries). Ownership: see `Owner`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpubox.diffs import unified

from .devices import HostDevices
from .lxcconf import Line, LxcConf, Section, fields, format_line, odd_characters
from .lxcmodel import DYNAMIC_MAJORS, StartModel, devn_path, parse_rule

ALLOW = "lxc.cgroup2.devices.allow"
DENY = "lxc.cgroup2.devices.deny"
MOUNT = "lxc.mount.entry"
V1_DEVICES = ("lxc.cgroup.devices.allow", "lxc.cgroup.devices.deny")
MODES = ("cgroup2", "devN")
_DEVN = re.compile(r"^dev(\d+)$")
# Nodes nvidia-modprobe creates 0666 (NVIDIA/nvidia-modprobe nvidia-modprobe-utils.c NV_DEVICE_FILE_MODE).
# A devN node in the container is 0660 root:root unless `mode=` says otherwise (pve-container
# LXC.pm create_passthrough_device_node), which would lock non-root CUDA users out: say 0666.
_DEVN_0666 = re.compile(r"^/dev/(nvidia\d+|nvidiactl|nvidia-modeset|nvidia-uvm|nvidia-uvm-tools)$")


def devn_value(path: str) -> str:
    return f"{path},mode=0666" if _DEVN_0666.match(path) else path


def rule_text(major: int) -> str:
    return f"c {major}:* rwm"


def mount_text(path: str) -> str:
    # `optional`: a node missing on the host must not stop the start; `create=file` makes the
    # mount point (and its parent directories) inside the container.
    return f"{path} {path.lstrip('/')} none bind,optional,create=file"


@dataclass
class Issue:
    # stale-rule | missing-rule | missing-mount | missing-devN | duplicate | conflict | cgroup-v1 |
    # redundant | unparsable | collision | devN-node-missing | foreign-unparsable | foreign-collision |
    # would-not-start
    kind: str
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
    f = fields(value)
    if len(f) < 4:
        return None
    return f[0], f[1], f[3]


def _good_mount(f) -> bool:
    opts = f[2].split(",") if f else []
    return "bind" in opts and "optional" in opts


def _is_nvidia_path(p: str) -> bool:
    return p.startswith("/dev/nvidia")


def _is_nvidia_target(target: str) -> bool:
    return target.strip("/").startswith("dev/nvidia")


def _loose_major(value: str) -> int | None:
    """The major a rule names even where lxc cannot parse it (to tell whose rule it is)."""
    m = re.match(r"^[abc]\s+(\d+):", value.strip())
    return int(m.group(1)) if m else None


def _newline(conf: LxcConf) -> str:
    """The file's line ending: new and replaced lines follow it. CRLF only for a file whose every
    ended line is CRLF (an unended last "...\r" reads as CRLF once ended); a file of mixed endings
    gets LF, so the choice does not hang on which line a repair happens to drop (fuzz)."""
    ends = []
    for s in conf.sections:
        for l in ([Line(s.header)] if s.header else []) + s.lines:
            if l.raw.endswith("\n"):
                ends.append(l.raw.endswith("\r\n"))
            elif l.raw.endswith("\r"):
                ends.append(True)
    return "\r\n" if ends and all(ends) else "\n"


def _nl(line: Line, nl: str) -> Line:
    if nl == "\n" or not line.raw.endswith("\n") or line.raw.endswith("\r\n"):
        return line
    return Line(line.raw[:-1] + nl, line.key, line.value, line.eq)


class Owner:
    """Which majors are provably this host's NVIDIA devices (the only rules gpubox may change):
    a major an NVIDIA driver holds now in /proc/devices, or a major that /proc/devices no longer
    lists, lies in the dynamic ranges (only nvidia-uvm/-caps/-nvlink/-nvswitch get dynamic majors
    among NVIDIA's) and the config itself passes nvidia-uvm or nvidia-caps nodes that its cgroup
    rules do not permit (the stale rule was theirs). A static major
    absent from /proc/devices (Coral 120, USB serial 188...) is a driver not loaded yet: foreign
    (docs/facts.md "Real container configs"). A dynamic major gpubox recorded as NVIDIA's when it last
    wrote this config (`recorded`) is proof too, for configs that name no uvm/caps node."""

    def __init__(
        self,
        hd: HostDevices,
        lines: list[Line],
        recorded: set[int] | frozenset = frozenset(),
        allows_all: bool = False,
    ):
        self.now = set(hd.nvidia_majors().values())
        self.hd = hd
        self.recorded = set(recorded)  # NVIDIA majors gpubox saw when it last wrote this config
        # Mounting uvm/caps nodes proves a stale dynamic rule was theirs only while a mounted node
        # still lacks a rule for its current major: once gpubox (or anyone) added that rule, the
        # mounts no longer vouch for a dynamic rule that could not be proven before, and devN nodes
        # never need a rule (Proxmox derives it at start) - a second run must not drop what the
        # first kept (found by the Hypothesis fuzz of decide()).
        named = {
            name
            for name in ("nvidia-uvm", "nvidia-caps")
            if any(f"dev/{name}" in (l.value or "") for l in lines if l.key == MOUNT)
        }
        # "Lacks a rule" means the cgroup does not permit the node: under `a` (or `c *:*`) a mount
        # needs no rule, gpubox adds none, and so its own mounts would vouch on the next run (fuzz:
        # `a` + a stale 506, dropped only by the second run).
        rules = [
            r for l in lines if l.key == ALLOW for r in [parse_rule(l.key, (l.value or "").strip())] if r
        ]

        # An unprivileged container's device list is a deny-list (pve-container's userns.conf.d
        # allows `a`): there too every mount is permitted without a rule (fuzz: an idmap line + a
        # stale 506, kept by the first run and dropped by the second).
        def permitted(major: int | None) -> bool:
            return major is not None and (
                allows_all or any(r.kind in ("a", "c") and r.major in (None, major) for r in rules)
            )

        self.names_dynamic = any(not permitted(hd.majors.get(name)) for name in named)

    def major(self, major: int | None) -> bool:
        if major is None:
            return False
        if major in self.now:
            return True
        return (
            not self.hd.registered(major)
            and major in DYNAMIC_MAJORS
            and (self.names_dynamic or major in self.recorded)
        )

    def stale(self, major: int | None) -> bool:
        return major is not None and major not in self.now and self.major(major)


def _entries(lines: list[Line], drop: set[int], cur) -> list[tuple[int, str, str]]:
    return [
        (i, cur(i).key, cur(i).value or "")
        for i in range(len(lines))
        if i not in drop and cur(i).key is not None
    ]


@dataclass
class _Edit:
    """The review's working state over the main section: the original lines, the lines dropped
    and replaced so far, the positions freed for new rules, and what was found. Each pass of
    `review` reads and extends it; `cur(i)` is line i as edited so far."""

    conf: LxcConf
    hd: HostDevices
    mode: str | None
    rdev: object
    host_exists: object
    own: "Owner"
    lines: list[Line]
    eq: str
    nl: str
    issues: list[Issue] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    drop: set[int] = field(default_factory=set)
    replace: dict[int, Line] = field(default_factory=dict)
    slots: list[int] = field(default_factory=list)  # positions of dropped rules, reused for new ones
    seen: set[tuple[str, str]] = field(default_factory=set)  # (key, value) of the lines kept

    def cur(self, i: int) -> Line:
        return self.replace.get(i, self.lines[i])

    def is_nv_line(self, l: Line) -> bool:
        """An NVIDIA line: a rule on a major gpubox owns, a mount of an NVIDIA node, an NVIDIA devN."""
        if l.key in (ALLOW, DENY, *V1_DEVICES):
            r = parse_rule(l.key, (l.value or "").strip())
            return self.own.major(r.major if r and not r.is_global else _loose_major(l.value or ""))
        if l.key == MOUNT:
            f = (l.value or "").split()
            return len(f) >= 2 and (_is_nvidia_path(f[0]) or _is_nvidia_target(f[1]))
        if l.key and _DEVN.match(l.key):
            return _is_nvidia_path(devn_path(l.value))
        return False

    def is_nv_devn(self, i: int) -> bool:
        return bool(
            i not in self.drop
            and self.cur(i).key
            and _DEVN.match(self.cur(i).key)
            and _is_nvidia_path(devn_path(self.cur(i).value))
        )

    def model(self) -> StartModel:
        """The start model of the lines as edited so far."""
        return StartModel.build(_entries(self.lines, self.drop, self.cur), self.rdev, self.host_exists)


def decide(
    conf: LxcConf,
    hd: HostDevices,
    mode: str | None = None,
    host_rdev=None,
    recorded: set[int] | frozenset = frozenset(),
    host_exists=None,
) -> Review:
    """Issues in the main section and the edited text (identical text when nothing to change).

    Changes only NVIDIA-owned lines (`Owner`); passes every NVIDIA node the way the config already
    passes NVIDIA nodes (devN or rule+mount; `mode` only for configs that pass none, or `devN` to
    convert); never passes one node both ways (the autodev hook would fail with EEXIST); checks the
    result against the start model (`lxcmodel.StartModel`). `host_rdev(path)` stats host nodes.

    The passes run in this order because each works on what the one before left: duplicates go
    first (so a converted v1 line is not counted twice), rules before mounts (a mount's need of a
    rule is judged over the rules kept), collisions before additions (a node passed both ways is
    passed once before the missing ones are counted), the start check last (over the new text)."""
    from gpubox.errors import GpuboxError

    if mode is not None and mode not in MODES:
        raise GpuboxError(f"gpubox_device_mode {mode!r} is not known", "use cgroup2 or devN")
    old = conf.render()
    lines = conf.main.lines
    rdev = host_rdev or _rdev_from(hd)
    before = StartModel.build(_entries(lines, set(), lambda i: lines[i]), rdev, host_exists)
    own = Owner(hd, lines, recorded, allows_all=before.unprivileged and before.list_type_allows_all())
    ed = _Edit(conf, hd, mode, rdev, host_exists, own, lines, conf.eq_style(), _newline(conf))
    _drop_duplicates(ed)
    _convert_cgroup_v1(ed)
    _review_rules(ed)
    _review_mounts(ed)
    nodes = hd.pass_nodes()
    node_mode = _node_mode(ed)
    _resolve_collisions(ed, nodes)
    model = ed.model()
    _report_missing_devn_nodes(ed, model)
    add_rules, add_mounts, add_devn = _additions(ed, model, nodes, node_mode)
    _warn_allow_all(ed, model)
    new_lines = _assemble(
        lines, ed.drop, ed.replace, ed.slots, add_rules, add_mounts, add_devn, ed.is_nv_line, ed.nl
    )
    new_conf = LxcConf([Section(conf.main.name, conf.main.header, new_lines), *conf.sections[1:]])
    _check_start(ed, new_lines)
    return Review(ed.issues, old, new_conf.render(), _odd_lines(conf) + ed.warnings)


def _odd_lines(conf: LxcConf) -> list[str]:
    """Name every line holding a character another line splitter would break it at (a bare CR,
    U+2028...) or a NUL: Proxmox reads such a line as one (split on \\n only), so a rule after a
    U+2028 in a comment is part of the comment for Proxmox and for gpubox alike; a person reading
    the file in an editor may see two lines. Named, never reinterpreted."""
    out, n = [], 0
    for s in conf.sections:
        for l in ([Line(s.header)] if s.header else []) + s.lines:
            n += 1
            odd = odd_characters(l.raw)
            if odd:
                shown = l.raw.rstrip("\r\n")
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                out.append(
                    f"line {n} holds {' and '.join(odd)}, which Proxmox keeps inside the line "
                    f"(it splits lines at \\n only): {shown!r}"
                )
    return out


def _drop_duplicates(ed: _Edit) -> None:
    """Pass 1: a second NVIDIA line with the same key and value goes (the first stays). Foreign
    duplicates are not gpubox's to touch; every line is remembered in `seen` either way."""
    for i, l in enumerate(ed.lines):
        if l.key is None:
            continue
        k = (l.key, (l.value or "").strip())
        if k in ed.seen and ed.is_nv_line(l):
            ed.drop.add(i)
            ed.issues.append(Issue("duplicate", f"duplicate line `{l.raw.strip()}`"))
        ed.seen.add(k)


def _convert_cgroup_v1(ed: _Edit) -> None:
    """Pass 2: cgroup v1 device lines do nothing on cgroup v2 (and are gone in PVE 9): NVIDIA's
    become cgroup2 lines (dropped when that line exists already), others are only reported."""
    for i, l in enumerate(ed.lines):
        if i in ed.drop or not (l.key or "").startswith("lxc.cgroup."):
            continue
        if l.key in V1_DEVICES and ed.is_nv_line(l):
            new_key = l.key.replace("lxc.cgroup.", "lxc.cgroup2.")
            if (new_key, (l.value or "").strip()) in ed.seen:
                ed.drop.add(i)
            else:
                ed.replace[i] = _nl(format_line(new_key, l.value or "", l.eq), ed.nl)
                ed.seen.add((new_key, (l.value or "").strip()))
            ed.issues.append(
                Issue("cgroup-v1", f"cgroup v1 line `{l.raw.strip()}` (ignored on cgroup v2, gone in PVE 9)")
            )
        else:
            ed.warnings.append(
                f"cgroup v1 line `{l.raw.strip()}` has no effect on cgroup v2: convert it by hand"
            )


def _review_rules(ed: _Edit) -> None:
    """Pass 3: device rules. NVIDIA's go when lxc cannot parse them, when they deny, when their
    major is stale, or (devN mode) when devN makes them redundant; the positions they leave take
    the new rules (the smallest diff). Foreign rules are only reported."""
    for i in range(len(ed.lines)):
        l = ed.cur(i)
        if i in ed.drop or l.key not in (ALLOW, DENY):
            continue
        val = (l.value or "").strip()
        r = parse_rule(l.key, val)
        major = r.major if r is not None and not r.is_global else _loose_major(val)
        ours = ed.own.major(major)
        if r is None:
            _unparsable_rule(ed, i, l, ours, val)
            continue
        if r.is_global or r.kind == "path":
            continue
        if not ours:
            if r.kind == "c" and r.major is not None and not ed.hd.registered(r.major) and l.key == ALLOW:
                ed.warnings.append(
                    f"`{l.raw.strip()}`: major {r.major} is not in /proc/devices "
                    "(driver not loaded?); "
                    "not an NVIDIA rule, left as it is"
                )
            continue
        if l.key == DENY:
            _drop_rule(
                ed, i, Issue("conflict", f"`{l.raw.strip()}` denies an NVIDIA device the container needs")
            )
            continue
        if ed.own.stale(r.major):
            hd = ed.hd
            now = f"nvidia-uvm is now {hd.uvm}" if hd.uvm is not None else "nvidia-uvm is not loaded yet"
            _drop_rule(
                ed,
                i,
                Issue(
                    "stale-rule",
                    f"`{l.raw.strip()}` names major {r.major}, which /proc/devices "
                    f"no longer lists ({now}): stale",
                ),
            )
            continue
        if ed.mode == "devN" and r.major not in _kept_mount_majors(ed):
            _drop_rule(ed, i, Issue("redundant", f"`{l.raw.strip()}` is redundant with devN entries"))


def _drop_rule(ed: _Edit, i: int, issue: Issue) -> None:
    ed.drop.add(i)
    ed.slots.append(i)
    ed.issues.append(issue)


def _unparsable_rule(ed: _Edit, i: int, l: Line, ours: bool, val: str) -> None:
    """A rule lxc cannot parse allows nothing: gpubox's goes (its rule is re-added right), a
    foreign one is reported (the container still starts)."""
    if ours:
        _drop_rule(
            ed,
            i,
            Issue(
                "unparsable",
                f"`{l.raw.strip()}`: lxc cannot parse it (one space after "
                "the type and after major:minor, access r/w/m): it logs "
                '"Failed to parse device rule" and skips it, so it allows nothing',
            ),
        )
    elif val:
        ed.warnings.append(
            f"`{l.raw.strip()}` is not an NVIDIA rule and lxc cannot parse it: lxc skips it "
            "(it allows nothing; the container still starts); fix it by hand"
        )


def _mount_rank(ed: _Edit, f) -> tuple[bool, bool]:
    """How good a mount entry is at passing its node: first, whether its source is the host's
    device node (an absolute path the host has as a device: lxc reads a relative source against
    its own working directory, finds nothing, and an `optional,create=file` entry then leaves an
    empty regular file at the target); then whether it is `bind,optional`."""
    src = f[0] if f else ""
    rd = ed.rdev(src) if src.startswith("/") else None
    return (bool(rd) and isinstance(rd, tuple) and rd[0] == "c", _good_mount(f))


def _optional_left_out(ed: _Edit, target: str) -> bool:
    """Whether a mount target is an optional node (nvidia-modeset, nvidia-caps) that no boot of the
    host creates: converting to devN keeps its `optional` mount, since a devN entry for it would
    stop the start on a boot without it."""
    path = "/" + target.strip("/")
    optional = (
        path == "/dev/nvidia-modeset" or path == "/dev/nvidia-caps" or path.startswith("/dev/nvidia-caps/")
    )
    return optional and not any(p == path or p.startswith(path + "/") for p in ed.hd.at_boot)


def _kept_mount_majors(ed: _Edit) -> set[int]:
    """Majors of the nodes the optional mounts kept in devN mode pass (`_optional_left_out`):
    their rules are not redundant."""
    out: set[int] = set()
    for l in ed.lines:
        f = _mount_fields(l.value or "") if l.key == MOUNT else None
        if not f or not _optional_left_out(ed, f[1]):
            continue
        t = "/" + f[1].strip("/")
        out |= {n.have[0] for n in ed.hd.nodes if n.have and (n.path == t or n.path.startswith(t + "/"))}
    return out


def _review_mounts(ed: _Edit) -> None:
    """Pass 4: NVIDIA mount entries. In devN mode they go (devN passes the node); two onto one
    target keep the one whose source is the host's node, then the `bind,optional` one, else the
    first (`_mount_rank`)."""
    by_target: dict[str, int] = {}
    for i in range(len(ed.lines)):
        l = ed.cur(i)
        if i in ed.drop or l.key != MOUNT or not ed.is_nv_line(l):
            continue
        f = _mount_fields(l.value or "")
        if f is None:
            continue
        if (
            ed.mode == "devN"
            and _is_nvidia_path(f[0])
            and _is_nvidia_target(f[1])
            and not _optional_left_out(ed, f[1])
        ):
            ed.drop.add(i)
            ed.issues.append(Issue("redundant", f"`{l.raw.strip()}` is redundant with devN entries"))
            continue
        t = f[1].strip("/")
        if t in by_target:
            j = by_target[t]
            keep_new = _mount_rank(ed, f) > _mount_rank(ed, _mount_fields(ed.cur(j).value or ""))
            loser = j if keep_new else i
            ed.issues.append(
                Issue("conflict", f"`{ed.cur(loser).raw.strip()}` mounts onto {t} like another line")
            )
            ed.drop.add(loser)
            if keep_new:
                by_target[t] = i
            continue
        by_target[t] = i


def _node_mode(ed: _Edit) -> str:
    """How missing NVIDIA nodes are passed: the way the config already passes NVIDIA nodes (devN
    when it uses only devN), `mode` only for a config that passes none, or devN when asked to
    convert."""
    lines = ed.lines
    nv_devn = [i for i in range(len(lines)) if ed.is_nv_devn(i)]
    nv_mount = [
        i
        for i in range(len(lines))
        if i not in ed.drop and ed.cur(i).key == MOUNT and ed.is_nv_line(ed.cur(i))
    ]
    if ed.mode == "devN" or (ed.mode is None and nv_devn):
        return "devN"
    if nv_mount or nv_devn:
        return "devN" if nv_devn and not nv_mount else "cgroup2"
    return ed.mode or "cgroup2"


def _resolve_collisions(ed: _Edit, nodes) -> None:
    """A node passed both ways (a mount entry and a devN entry) fails the start with EEXIST in
    the autodev hook: an NVIDIA mount entry goes (devN reads the major at every start); a
    foreign line that does it is the operator's to fix."""
    model = ed.model()
    for n in nodes:
        provs = model.providers(n.path)
        if not any(k == "devN" for k, _ in provs):
            continue
        for k, idx in provs:
            if k != "mount":
                continue
            if ed.is_nv_line(ed.cur(idx)):
                ed.drop.add(idx)
                ed.issues.append(
                    Issue(
                        "collision",
                        f"`{ed.cur(idx).raw.strip()}` and a devN entry both pass "
                        f"{n.path}: the autodev hook fails with EEXIST; "
                        "the mount entry goes",
                    )
                )
            else:
                ed.issues.append(
                    Issue(
                        "foreign-collision",
                        f"`{ed.cur(idx).raw.strip()}` puts {n.path} in "
                        "place before its devN entry: the start fails; "
                        "fix it by hand",
                        fixable=False,
                    )
                )


def _report_missing_devn_nodes(ed: _Edit, model: StartModel) -> None:
    """An NVIDIA devN entry whose node is missing on the host stops the start (pve: "Device ...
    does not exist"); the file cannot fix that, host-devices can (the start model lists those
    entries in its errors, not in `model.devn`)."""
    devn_by_path = {p for _, _, p in model.devn}
    for i, l in enumerate(ed.lines):
        if i not in ed.drop and l.key and _DEVN.match(l.key) and devn_path(l.value) not in devn_by_path:
            p = devn_path(l.value)
            if _is_nvidia_path(p):
                ed.issues.append(
                    Issue(
                        "devN-node-missing",
                        f"{l.key}: {p} is missing on the host: the "
                        "container will not start (fix host-devices first)",
                        fixable=False,
                    )
                )


def _additions(ed: _Edit, model: StartModel, nodes, node_mode: str) -> tuple[list, list, list]:
    """(rules, mounts, devN entries) to add: every node the host offers that nothing passes
    (a devN entry at the first free index, or a bind mount), and one allow rule per major the
    passed nodes need and no rule permits. A devN node needs no rule: pve adds `c M:m rw`."""
    lines, nl = ed.lines, ed.nl
    add_rules: list[Line] = []
    add_mounts: list[Line] = []
    add_devn: list[Line] = []
    used = {int(m.group(1)) for l in lines if l.key and (m := _DEVN.match(l.key))}
    devn_by_path = {p for _, _, p in model.devn}
    k = 0
    missing_majors: dict[int, str] = {}
    names = {v: n for n, v in ed.hd.nvidia_majors().items()}
    for n in nodes:
        rd = n.want or n.have
        if n.path in devn_by_path or any(
            devn_path(ed.cur(i).value) == n.path
            for i in range(len(lines))
            if i not in ed.drop and ed.cur(i).key and _DEVN.match(ed.cur(i).key)
        ):
            continue  # devN: node made at start, `c M:m rw` added by pve
        if model.providers(n.path):
            if rd and not model.permitted(*rd):
                missing_majors.setdefault(rd[0], names.get(rd[0], "nvidia"))
            continue
        if node_mode == "devN" and not n.required and n.path not in ed.hd.at_boot:
            ed.warnings.append(
                f"{n.path} is left out: optional, and nothing makes the host create it at every boot, "
                "so a devN entry for it would stop the start on a boot without it (a devN entry for it "
                "makes host-devices persist its creation)"
            )
            continue
        if node_mode == "devN":
            while k in used:
                k += 1
            used.add(k)
            add_devn.append(_nl(format_line(f"dev{k}", devn_value(n.path)), nl))
            ed.issues.append(Issue("missing-devN", f"no devN entry for {n.path}"))
        else:
            add_mounts.append(_nl(format_line(MOUNT, mount_text(n.path), ed.eq), nl))
            ed.issues.append(Issue("missing-mount", f"no `{MOUNT}` for {n.path}"))
            if rd and not model.permitted(*rd):
                missing_majors.setdefault(rd[0], names.get(rd[0], "nvidia"))
    for major, name in sorted(missing_majors.items()):
        add_rules.append(_nl(format_line(ALLOW, rule_text(major), ed.eq), nl))
        ed.issues.append(Issue("missing-rule", f"no `{ALLOW}` rule allows {name} (major {major})"))
    return add_rules, add_mounts, add_devn


def _warn_allow_all(ed: _Edit, model: StartModel) -> None:
    """A device list that allows everything is said, not changed: an unprivileged container's
    (pve-container's userns.conf.d allows `a`) or an explicit `a` rule."""
    if not model.list_type_allows_all():
        return
    if model.unprivileged and not any(r is not None and r.is_global for *_, r in model.rules):
        ed.warnings.append(
            "unprivileged container: pve-container's userns.conf.d resets the device rules and "
            "allows `a`, so every device opens unless a deny rule matches (file modes and the "
            "idmap decide the rest)"
        )
    else:
        ed.warnings.append(f"`{ALLOW}: a` lets the container use every device (not gpubox's to change)")


def _check_start(ed: _Edit, new_lines: list[Line]) -> None:
    """The last pass: the start model over the new text. What would still stop the start is
    named with its line and repair, unless an unfixable issue already says why."""
    after = StartModel.build(
        [(i, l.key, l.value or "") for i, l in enumerate(new_lines) if l.key], ed.rdev, ed.host_exists
    )
    for e in after.errors:
        if not any(not i.fixable for i in ed.issues):
            ed.issues.append(Issue("would-not-start", _blocker(e, new_lines), fixable=False))


def _blocker(error: str, lines: list[Line]) -> str:
    """The start model's error with the line that causes it and that line's repair (the operator's
    to make: the line is not gpubox's)."""
    keyed = [l for l in lines if l.key]
    m = re.match(r"^Device (\S+) does not exist$", error)
    if m:
        for l in keyed:
            if _DEVN.match(l.key) and devn_path(l.value) == m.group(1):
                return (
                    f"the container would not start: `{l.raw.strip()}`: {m.group(1)} does not exist on "
                    f'the host (pve: "{error}"); reconnect the device or load its driver, or remove '
                    f"the `{l.key}` line"
                )
    m = re.search(r'Failed to mount "([^"]+)"', error)
    if m:
        for l in keyed:
            if l.key == MOUNT and (l.value or "").split()[:1] == [m.group(1)]:
                rel = (
                    ""
                    if m.group(1).startswith("/")
                    else " (a relative source: lxc does not read it on the host)"
                )
                return (
                    f"the container would not start: `{l.raw.strip()}`: its source {m.group(1)} is missing"
                    f"{rel} and the entry is not `optional`, so lxc fails the mount; create the source, "
                    "add `optional` to its options, or remove the line"
                )
    m = re.search(r'Failed to open file "([^"]+)" \(lxc.include\)', error)
    if m:
        return (
            f"the container would not start: `lxc.include: {m.group(1)}` names a file missing on the "
            "host (lxc cannot load the config); restore the file or remove the line"
        )
    if "bpf program" in error:
        bad = [
            l.raw.strip()
            for l in keyed
            if l.key in (ALLOW, DENY) and (l.value or "").strip().startswith("a ")
        ]
        return (
            f"the container would not start: {', '.join(f'`{b}`' for b in bad) or 'a device rule'}: the "
            "kernel refuses the BPF device program (an `a` rule with access); write "
            f"`{ALLOW}: a` to allow every device, or remove the line"
        )
    return f"the container would not start: {error}"


def _rdev_from(hd: HostDevices):
    """host_rdev from what read_host_devices stat()ed; other paths are taken to exist (unknown)."""
    known = {n.path: n for n in hd.nodes}

    def rdev(path: str):
        n = known.get(path)
        if n is None:
            return ("c", 0, 0) if not _is_nvidia_path(path) else None
        return ("c", *n.have) if n.present and n.is_char else None

    return rdev


def _assemble(lines, drop, replace, slots, add_rules, add_mounts, add_devn, is_nv, nl) -> list[Line]:
    """Apply drops/replacements; new lines join the NVIDIA group of their kind (else their kind,
    else the raw lxc lines, else the end)."""
    add_rules = list(add_rules)
    slot_fill: dict[int, Line] = {}
    for i in sorted(slots):
        if add_rules:
            slot_fill[i] = add_rules.pop(0)
    last_content = max((i for i, l in enumerate(lines) if not l.blank), default=-1)

    def last_of(pred):
        return max((i for i, l in enumerate(lines) if pred(l)), default=None)

    def anchor(*cands):
        return next((c for c in cands if c is not None), last_content)

    is_rule = lambda l: l.key in (ALLOW, DENY, *V1_DEVICES)  # noqa: E731
    is_devn = lambda l: bool(l.key and _DEVN.match(l.key))  # noqa: E731
    nv_rule = last_of(lambda l: is_rule(l) and is_nv(l))
    nv_mount = last_of(lambda l: l.key == MOUNT and is_nv(l))
    nv_devn = last_of(lambda l: is_devn(l) and is_nv(l))
    any_rule = last_of(is_rule)
    lxc_anchor = last_of(lambda l: l.is_lxc)
    after: dict[int, list[Line]] = {}
    if add_rules:
        after.setdefault(anchor(nv_rule, nv_mount, any_rule, lxc_anchor), []).extend(add_rules)
    if add_mounts:
        after.setdefault(
            anchor(nv_mount, nv_rule, last_of(lambda l: l.key == MOUNT), any_rule, lxc_anchor), []
        ).extend(add_mounts)
    if add_devn:
        after.setdefault(anchor(nv_devn, last_of(is_devn)), []).extend(add_devn)
    out: list[Line] = list(after.get(-1, []))
    for i, l in enumerate(lines):
        if i in slot_fill:
            out.append(slot_fill[i])
        elif i not in drop:
            out.append(replace.get(i, l))
        extra = after.get(i)
        if extra:
            if out and not out[-1].raw.endswith("\n"):
                end = "\n" if out[-1].raw.endswith("\r") and nl == "\r\n" else nl
                out[-1] = Line(out[-1].raw + end, out[-1].key, out[-1].value, out[-1].eq)
            out.extend(extra)
    return out
