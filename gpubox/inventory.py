"""The Ansible YAML inventory, read the way ansible-playbook reads it.

One source of box facts for the CLI and the playbooks: we hand the sources to Ansible's own
InventoryManager/VariableManager (group vars, host vars, children, group_vars/ and host_vars/
directories, precedence, vault) instead of re-implementing its merge rules. YAML is parsed once
more by us first, only to turn a syntax error into a one-line message with file and line (Ansible
merely warns and carries on with an empty inventory).
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import InventoryError
from .invschema import check_box, check_host
from .invspell import check_spellings
from .readlimit import NotRegular, read_regular

INVENTORY_ENV = "GPUBOX_INVENTORY"
CONTAINER_GROUP = "gpu_containers"
HOST_GROUP = "proxmox_hosts"
_ANSIBLE_MAGIC = {
    "inventory_file",
    "inventory_dir",
    "inventory_hostname",
    "inventory_hostname_short",
    "group_names",
    "groups",
    "playbook_dir",
    "omit",
    "ansible_playbook_python",
    "ansible_config_file",
    "ansible_version",
    "ansible_check_mode",
    "ansible_diff_mode",
    "ansible_forks",
    "ansible_inventory_sources",
    "ansible_run_tags",
    "ansible_skip_tags",
    "ansible_verbosity",
    "hostvars",
    "environment",
    "role_names",
    "ansible_play_hosts",
    "ansible_play_batch",
    "ansible_play_hosts_all",
    "ansible_dependent_role_names",
    "ansible_play_role_names",
    "ansible_role_names",
    "ansible_facts",
    "play_hosts",
    "ansible_collection_name",
    "ansible_search_path",
    "ansible_loop_var",
}


def default_inventory_path() -> Path:
    """$GPUBOX_INVENTORY, else inventory/ next to the project (or the current directory)."""
    env = os.environ.get(INVENTORY_ENV)
    if env:
        return Path(env)
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent):
        cand = base / "inventory"
        if cand.is_dir():
            return cand
    return Path.cwd() / "inventory"


class _CheckLoader(yaml.SafeLoader):
    """SafeLoader that accepts Ansible's !vault and !unsafe tags (values stay opaque)."""


_CheckLoader.add_constructor("!vault", lambda loader, node: "<vault>")
_CheckLoader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


_VARS_DIRS = ("group_vars", "host_vars")
_VARS_SUFFIXES = ("", ".yml", ".yaml", ".json")  # what Ansible loads from group_vars/host_vars


def _yaml_files(path: Path) -> list[Path]:
    """Every file Ansible will parse as YAML for this inventory: the file itself (or the YAML files
    of the directory) and the group_vars/ and host_vars/ beside it. Entries that are not regular
    files (a FIFO, a device) are listed too, so the bounded read refuses them before Ansible
    blocks on them."""
    if path.is_dir():
        base, out = path, []
        for p in sorted(path.rglob("*")):
            if ".git" in p.parts or p.is_dir():
                continue
            in_vars = any(part in _VARS_DIRS for part in p.relative_to(path).parts[:-1])
            if p.suffix in (".yml", ".yaml") or (in_vars and p.suffix in _VARS_SUFFIXES) or not p.is_file():
                out.append(p)
        return out
    base, out = path.parent, [path]
    for d in _VARS_DIRS:
        top = base / d
        if not top.is_dir():
            continue
        for p in sorted(top.rglob("*")):
            if not p.is_dir() and (p.suffix in _VARS_SUFFIXES or not p.is_file()):
                out.append(p)
    return out


def _precheck(path: Path) -> None:
    if not path.exists():
        raise InventoryError(f"inventory {path} does not exist", f"pass -i PATH or set ${INVENTORY_ENV}")
    for f in _yaml_files(path):
        text = _read_source(f)
        try:
            root = _bounded(f, text)
            check_spellings(f, root)
            data = yaml.load(text, Loader=_CheckLoader)
        except yaml.YAMLError as exc:
            if f == path and _looks_ini(text):
                raise _ini_error(f) from None
            mark = getattr(exc, "problem_mark", None)
            where = f"{f}:{mark.line + 1}" if mark else str(f)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise InventoryError(
                f"malformed YAML at {where}: {problem}", "fix the file's syntax (yamllint shows the spot)"
            ) from None
        except ValueError as exc:  # a scalar the resolver typed but cannot convert (`0x_`, `1:_`)
            raise InventoryError(
                f"malformed YAML in {f}: {' '.join(str(exc).split())[:200]}", "fix the value's spelling"
            ) from None
        in_vars_dir = any(part in ("group_vars", "host_vars") for part in f.parts)
        if data is not None and not isinstance(data, dict):
            if f == path and _looks_ini(text):
                raise _ini_error(f)
            kind = "a variables file" if in_vars_dir else "an inventory"
            raise InventoryError(f"{f} is not a YAML mapping", f"{kind} must be a mapping of names")


def check_source(path: str | os.PathLike) -> None:
    """The gate on an inventory source's text, without loading it: it exists, every file Ansible
    would parse for it is bounded and well-formed YAML (no alias bomb, no INI), and no value gpubox
    reads is spelled so that YAML 1.1 reads it otherwise (`0200` is octal 128). What `gpubox -i PATH`
    refuses before anything else; the playbooks run it once on the control node (Ansible's own
    reading has already turned `0200` into 128 by the time a module sees the value)."""
    _precheck(Path(path))


_INI_SECTION = re.compile(r"\[[^\]\s]+\]")
_INI_HOST_LINE = re.compile(r"[^\s=:#\[]+(\s+[A-Za-z_][A-Za-z0-9_]*=\S*)+")


def _looks_ini(text: str) -> bool:
    """Ansible's INI inventory (`[group]`, `host var=value`): its first meaningful line. Such a
    file is not YAML, and some of it even parses as a YAML string, so it gets its own message."""
    for line in text.split("\n"):
        line = line.strip()
        if line and not line.startswith(("#", ";")):
            return bool(_INI_SECTION.fullmatch(line) or _INI_HOST_LINE.fullmatch(line))
    return False


def _ini_error(f: Path) -> InventoryError:
    # Ansible reads INI values by rules of their own (literal_eval on host lines, strings under
    # :vars); converting once with Ansible itself keeps its reading, which a second parser here
    # could only approximate.
    return InventoryError(
        f"inventory {f} is in Ansible's INI format; gpubox reads YAML inventories",
        f"convert it once with Ansible's own reading: ansible-inventory -i {f} --list --yaml > inventory.yml",
    )


MAX_BYTES = 4 << 20  # an inventory file larger than this is not an inventory
MAX_NODES = 200_000  # YAML nodes after alias expansion (a real inventory has hundreds)


def _read_source(f: Path) -> str:
    try:
        data = read_regular(f, MAX_BYTES, what="inventory file")
    except NotRegular as exc:
        raise InventoryError(
            exc.problem, f"an inventory file is a regular file of at most {MAX_BYTES >> 20} MiB"
        ) from None
    except OSError as exc:
        from .errors import os_error

        raise os_error(exc) from None
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        from .errors import not_utf8

        raise not_utf8(f"inventory file {f}", data, exc) from None


def _bounded(f: Path, text: str):
    """Refuse a YAML alias bomb (billion laughs) before anything expands it.

    PyYAML shares aliased nodes, but Ansible's loader, its variable merging and templating copy
    them out: nine levels of nine aliases are 387 million values, minutes and gigabytes. So the
    node graph is composed (cheap: aliases stay shared) and its expanded size counted with
    memoisation; a recursive alias counts as unbounded. Returns the composed root for the
    spelling check (gpubox.invspell)."""
    try:
        root = yaml.compose(text, Loader=_CheckLoader)
    except RecursionError:
        raise InventoryError(f"{f} nests too deeply", "flatten the structure") from None
    if root is None:
        return None
    memo: dict[int, int] = {}
    active: set[int] = set()

    def size(node) -> int:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise InventoryError(
                f"{f}: a YAML alias refers to itself (line {node.start_mark.line + 1})",
                "remove the recursive anchor/alias",
            )
        active.add(key)
        n = 1
        if isinstance(node, yaml.SequenceNode):
            for child in node.value:
                n += size(child)
                if n > MAX_NODES:
                    break
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                n += size(k) + size(v)
                if n > MAX_NODES:
                    break
        active.discard(key)
        memo[key] = n
        if n > MAX_NODES:
            raise InventoryError(
                f"{f}: YAML aliases expand to more than {MAX_NODES} values "
                f"(near line {node.start_mark.line + 1}; an alias bomb?)",
                "write the values out, or use fewer nested aliases",
            )
        return n

    try:
        size(root)
    except RecursionError:
        raise InventoryError(f"{f} nests too deeply", "flatten the structure") from None
    return root


@dataclass
class HostEntry:
    """One inventory host with its fully resolved variables."""

    name: str
    vars: dict[str, Any]
    groups: list[str] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        return self.vars.get(key, default)

    @property
    def root(self) -> str:
        return str(self.vars.get("gpubox_root") or "/")

    def public_vars(self) -> dict[str, Any]:
        return {k: v for k, v in sorted(self.vars.items()) if k not in _ANSIBLE_MAGIC}


@dataclass
class Box:
    """A container that serves the model, and the Proxmox host that runs it."""

    container: HostEntry
    host: HostEntry

    @property
    def name(self) -> str:
        return self.container.name

    @property
    def vmid(self) -> int:
        return int(str(self.container.vars["gpubox_vmid"]).strip())

    @property
    def id(self) -> str:
        """The box's identity (Proxmox host + vmid): names its results, history, units and lock."""
        from .identity import box_id

        return box_id(self.host.name, self.vmid)

    def var(self, key: str, default: Any = None) -> Any:
        """A box setting: the container's value, else its Proxmox host's."""
        if key in self.container.vars:
            return self.container.vars[key]
        return self.host.vars.get(key, default)


class Inventory:
    """Hosts and boxes of an Ansible inventory (file or directory)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_inventory_path()
        _precheck(self.path)
        self._hosts: dict[str, HostEntry] = {}
        self._load()

    def _load(self) -> None:
        # Imported here: ansible is heavy and only the inventory needs it.
        from ansible.errors import AnsibleError
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager

        loader = DataLoader()
        vault_file = os.environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
        if vault_file:
            from ansible.cli import CLI

            loader.set_vault_secrets(
                CLI.setup_vault_secrets(loader, vault_ids=[], vault_password_files=[vault_file])
            )
        try:
            with _strict_ansible_parse() as failures:
                try:
                    im = InventoryManager(loader=loader, sources=[str(self.path)])
                except AnsibleError as exc:
                    raise InventoryError(
                        f"cannot read inventory {self.path}: {_parse_failure(failures, exc)}",
                        "check the file against Ansible's YAML inventory format",
                    ) from None
            vm = VariableManager(loader=loader, inventory=im)
            for h in im.get_hosts():
                raw = vm.get_vars(host=h, include_hostvars=False)
                templar = Templar(loader=loader, variables=raw)
                resolved = {}
                for k, v in raw.items():
                    if k in _ANSIBLE_MAGIC:
                        continue
                    resolved[k] = _plain(_template(templar, h.name, k, v, AnsibleError))
                groups = sorted(g.name for g in h.get_groups() if g.name not in ("all", "ungrouped"))
                check_host(h.name, resolved)
                self._hosts[h.name] = HostEntry(h.name, resolved, groups)
        except AnsibleError as exc:
            msg = " ".join(str(exc).split())[:300]
            raise InventoryError(
                f"cannot read inventory {self.path}: {msg}",
                "check the file against Ansible's YAML inventory format",
            ) from None

    # -- queries ---------------------------------------------------------------------------
    @property
    def hosts(self) -> dict[str, HostEntry]:
        return dict(self._hosts)

    def host(self, name: str) -> HostEntry:
        try:
            return self._hosts[name]
        except KeyError:
            known = ", ".join(sorted(self._hosts)) or "none"
            raise InventoryError(f"unknown host {name!r} in {self.path}", f"known hosts: {known}") from None

    def _unknown_box(self, name: str) -> InventoryError:
        from .suggest import with_hint

        names = self.box_names()
        known = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "") or "none"
        return InventoryError(
            with_hint(f"unknown box {name!r} in {self.path}", name, names), f"known boxes: {known}"
        )

    def box_names(self) -> list[str]:
        return sorted(n for n, h in self._hosts.items() if "gpubox_vmid" in h.vars)

    def box(self, name: str) -> Box:
        ct = self._hosts.get(name)
        if ct is None or ("gpubox_vmid" not in ct.vars and CONTAINER_GROUP not in ct.groups):
            raise self._unknown_box(name)
        hostname = ct.vars.get("gpubox_proxmox_host")
        # The one gate (invschema.check_box), as the Ansible module applies it.
        check_box(name, ct.vars, hostname, self._hosts[hostname].vars if hostname in self._hosts else {})
        if hostname not in self._hosts:
            known = ", ".join(sorted(n for n in self._hosts if n not in self.box_names())) or "none"
            raise InventoryError(
                f"box {name}: gpubox_proxmox_host {hostname!r} is not in the inventory",
                f"add it, or name one of: {known}",
            )
        return Box(container=ct, host=self._hosts[hostname])


def _template(templar, host: str, key: str, value: Any, error_cls) -> Any:
    """Resolve `{{ }}` like Ansible does at run time.

    Ansible templates lazily, so an inventory may hold variables that only resolve inside a play
    (facts, play vars): those stay as written. The variables gpubox itself reads must resolve."""
    try:
        return templar.template(value)
    except error_cls as exc:
        if key.startswith(("gpubox_", "ansible_")):
            msg = " ".join(str(exc).split("\n")[0].split())[:200]
            raise InventoryError(
                f"{host}: variable {key} cannot be resolved: {msg}",
                "define what it refers to in the inventory, or write the value directly",
            ) from None
        return value


@contextmanager
def _strict_ansible_parse():
    """Make an unparseable inventory source an error, not Ansible's warnings + empty inventory.

    Ansible tries every inventory plugin, prints each failure as a warning and carries on with
    only localhost; we turn INVENTORY_ANY_UNPARSED_IS_FAILED on for this parse and collect the
    warnings so the error can name the real cause in one line. Warnings of a parse that
    succeeds are passed on as Ansible would print them."""
    from ansible import constants as C
    from ansible.utils.display import Display

    display = Display()  # a singleton: the one the inventory plugins print through
    seen: list[str] = []
    saved = C.INVENTORY_ANY_UNPARSED_IS_FAILED
    orig_warning = display.warning
    orig_eaw = getattr(display, "error_as_warning", None)

    def warning(msg, *a, **kw):
        seen.append(str(msg))

    def error_as_warning(msg, exception=None, *a, **kw):
        seen.append(f"{msg} {exception}" if exception is not None else str(msg))

    C.INVENTORY_ANY_UNPARSED_IS_FAILED = True
    display.warning = warning
    if orig_eaw is not None:
        display.error_as_warning = error_as_warning
    ok = False
    try:
        yield seen
        ok = True
    finally:
        C.INVENTORY_ANY_UNPARSED_IS_FAILED = saved
        del display.warning
        if orig_eaw is not None:
            del display.error_as_warning
        if ok:
            for w in seen:
                orig_warning(w)


def _parse_failure(seen: list[str], exc: Exception) -> str:
    """The most telling reason among Ansible's per-plugin failures (the YAML plugin's, if any)."""
    pick = next((w for w in seen if "'yaml'" in w or "yaml plugin" in w), None) or str(exc)
    text = " ".join(pick.split())
    text = re.sub(r"^.*?Failed to parse inventory with '?yaml'? plugin\.?:? ?", "", text)
    text = re.sub(r"<<< caused by >>> ", "", text)
    text = text.split(" Origin: ")[0]
    # Ansible's tagged container types read as plain ones: "<class '..._AnsibleTaggedList'>" -> list
    text = re.sub(
        r"\"?<class '(?:[\w.]*\.)?_?(?:AnsibleTagged)?(\w+)'>\"?", lambda m: m.group(1).lower(), text
    )
    return text[:300]


def _plain(value: Any) -> Any:
    """Ansible's tagged/unsafe str subclasses to plain Python types (JSON- and YAML-safe)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return str(value)
