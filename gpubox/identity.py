"""A box's identity: its Proxmox host's inventory name and its vmid, as one injective name.

Unit names, state files, history stores, result files and lock names all derive from `box_id`,
so two different boxes never share one of them. A lossy slug (`gpu.a` and `gpu_a` -> `gpu_a`)
let the second box's health-check unit replace the first's.

The encoding keeps `[A-Za-z0-9-]` and writes every other byte of the UTF-8 name as `_xx` (two
lower-case hex digits; `_` itself is `_5f`), so it is reversible (`decode_name`) and carries
only characters a systemd unit name, a cron.d file name (Debian cron(8) ignores names outside
`[A-Za-z0-9_-]`) and any file system accept. A name whose encoding would exceed `MAX_ENCODED`
becomes a prefix plus `__` plus a SHA-256 digest of the full name; `__` never occurs in an
encoding (every `_` is followed by two hex digits), so the long form cannot collide with a short
one either.
"""

from __future__ import annotations

import hashlib
import re

MAX_ENCODED = 80
_KEEP = re.compile(rb"[A-Za-z0-9-]")
_ID = re.compile(r"^(?P<host>.+)-ct(?P<vmid>[0-9]+)$")


def encode_name(name: str) -> str:
    """NAME as `[A-Za-z0-9_-]+`, injectively (see the module docstring)."""
    raw = str(name).encode("utf-8", "surrogateescape")
    out = "".join(chr(b) if _KEEP.match(bytes([b])) else f"_{b:02x}" for b in raw) or "_"
    if len(out) <= MAX_ENCODED:
        return out
    digest = hashlib.sha256(raw).hexdigest()[:32]
    return f"{out[: MAX_ENCODED - 34].rstrip('_')}__{digest}"


def decode_name(encoded: str) -> str | None:
    """The name back from `encode_name` (None for the hashed long form or a foreign string)."""
    if "__" in encoded or not re.fullmatch(r"(?:[A-Za-z0-9-]|_[0-9a-f]{2})+", encoded):
        return None
    raw = re.sub(rb"_([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]), encoded.encode())
    return raw.decode("utf-8", "surrogateescape")


def box_id(host: str, vmid: int | str) -> str:
    """`<encoded host>-ct<vmid>`: the one name of the container VMID on Proxmox host HOST."""
    v = str(vmid)
    if not v.isdigit() or not v.isascii():
        raise ValueError(f"vmid {vmid!r} is not a number")
    return f"{encode_name(host)}-ct{int(v)}"


def of_box(box) -> str:
    """box_id of an inventory Box (its Proxmox host's inventory name and its vmid)."""
    return box_id(box.host.name, box.vmid)


def parse_box_id(text: str) -> tuple[str | None, int] | None:
    """(host, vmid) back from a box_id (host None when it was hashed), or None."""
    m = _ID.match(text or "")
    if not m:
        return None
    return decode_name(m.group("host")), int(m.group("vmid"))
