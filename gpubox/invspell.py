"""Number and boolean spellings in the inventory source that YAML 1.1 reads otherwise than they look.

Ansible reads inventories with a YAML 1.1 resolver (PyYAML's): `gpubox_vmid: 0200` is octal 128,
`0x10` is 16, `1:20` is sexagesimal 80, `1_000` is 1000, and `no`/`on` are booleans. Once parsed,
128 is a valid vmid, so the value alone cannot show the mistake: `lxc fix` would edit
/etc/pve/lxc/128.conf. The check therefore runs on the composed node graph, where each scalar
keeps its source text and the tag the resolver gave it, and refuses every such spelling in what
gpubox reads (the SCHEMA variables and everything under a `gpubox_` variable) with one line naming
file, line, variable and the plain spelling to write. Variables gpubox does not read are
Ansible's business and left alone (`mode: 0644` in a role's group_vars is meant as octal).
"""

from __future__ import annotations

import re

import yaml

from .errors import InventoryError
from .invschema import SCHEMA, _bool

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")
_TEXT_KEYS = {"gpubox_env"}  # mappings of NAME: text (environment variables)


def check_spellings(f, root: yaml.Node | None) -> None:
    """Raise InventoryError for the first scalar gpubox reads whose spelling YAML reinterprets."""
    if root is None:
        return
    seen: set[tuple[int, str, bool]] = set()
    # (node, last mapping key, inside a variable gpubox reads, dotted path from that variable)
    stack: list[tuple[yaml.Node, str | None, bool, str]] = [(root, None, False, "")]
    while stack:
        node, key, ours, path = stack.pop()
        mark = (id(node), path, ours)
        if mark in seen:  # aliases are shared nodes: visit each once per context
            continue
        seen.add(mark)
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else None
                mine = ours or bool(name and (name in SCHEMA or name.startswith("gpubox_")))
                inner = f"{path}.{name}" if ours and path else (name or "")
                stack.append((v, name if not ours or key not in _TEXT_KEYS else key, mine, inner))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, key, ours, path) for v in node.value)
        elif ours and isinstance(node, yaml.ScalarNode) and node.style is None:
            _check_scalar(f, node, key or "value", path or key or "value")


def _check_scalar(f, node: yaml.ScalarNode, key: str, path: str) -> None:
    """KEY (the innermost name) decides what the value is for; PATH (`gpubox_bench.max_age_s`) is
    what the message names, as the user finds it in the file."""
    text = node.value
    where = f"inventory {f}:{node.start_mark.line + 1}: {path} {text}"
    if node.tag == _INT and not _PLAIN_INT.fullmatch(text):
        try:
            value = yaml.safe_load(text)
        except ValueError:  # `0x_`: resolved as an int, which int() then cannot read
            raise InventoryError(
                f"{where} is not a plain decimal number (YAML cannot read it at all)", "write plain digits"
            ) from None
        reading, fix = _int_reading(text, value)
        raise InventoryError(f"{where} is not a plain decimal number (YAML would read it as {reading})", fix)
    if node.tag == _FLOAT and not _PLAIN_FLOAT.fullmatch(text):
        try:
            value = yaml.safe_load(text)
        except ValueError:
            raise InventoryError(
                f"{where} is not a plain decimal number (YAML cannot read it at all)", "write plain digits"
            ) from None
        raise InventoryError(
            f"{where} is not a plain decimal number (YAML would read it as {value!r})",
            f"write {value!r}" if value == value and abs(value) != float("inf") else "write a plain number",
        )
    if node.tag == _BOOL and text.lower() not in ("true", "false") and _wants_text(key):
        value = yaml.safe_load(text)
        raise InventoryError(
            f"{where} would be read by YAML as the boolean {str(value).lower()}",
            f"quote it ('{text}') if you mean the text",
        )


def _wants_text(key: str) -> bool:
    """A variable gpubox reads as text or a number, where `no` read as false surprises; in a
    boolean variable (and in nested settings, mostly switches) yes/no are Ansible's usual words."""
    return key in _TEXT_KEYS or (key in SCHEMA and SCHEMA[key] is not _bool)


def _int_reading(text: str, value: int) -> tuple[str, str]:
    """How YAML 1.1 reads TEXT, and the plain spelling to write instead."""
    body = text.lstrip("+-").replace("_", "")
    sign = "-" if text.startswith("-") else ""
    if ":" in text:
        return f"base-60 {value}", f"write {value}"
    if body[:2].lower() == "0x":
        return f"hex {value}", f"write {value}"
    if body[:2].lower() == "0b":
        return f"binary {value}", f"write {value}"
    if body[:1] == "0" and len(body) > 1:
        digits = f"{sign}{int(body, 10)}" if body.isdigit() else None
        if digits is not None and digits != str(value):
            return f"octal {value}", f"write {digits}, or {value} if octal was meant"
        return f"{value}", f"write {value}"
    return f"{value}", f"write {value}"
