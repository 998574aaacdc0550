"""`gpubox inventory list|show`: what the CLI and the playbooks will use for each box."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from ..clihelp import json_option, state
from ..output import console, plain, print_json


@click.group()
def inventory() -> None:
    """Boxes and hosts of the Ansible inventory."""


@inventory.command("list")
@json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """List the boxes (containers with gpubox_vmid) and their Proxmox hosts."""
    inv = state(ctx).inventory
    rows = []
    for name in inv.box_names():
        b = inv.box(name)
        conn = b.container.get("gpubox_connection") or b.container.get("ansible_connection") or "ssh"
        rows.append(
            {
                "box": name,
                "vmid": b.vmid,
                "proxmox_host": b.host.name,
                "connection": conn,
                "root": b.container.root,
                "host_root": b.host.root,
                "groups": b.container.groups,
            }
        )
    if as_json:
        print_json(
            {
                "inventory": str(inv.path),
                "boxes": rows,
                "hosts": sorted(n for n in inv.hosts if n not in inv.box_names()),
            }
        )
        return
    t = Table(title=escape(f"boxes in {inv.path}"))
    for c in ("box", "vmid", "proxmox host", "connection", "root"):
        t.add_column(c)
    for r in rows:
        t.add_row(*(plain(r[k]) for k in ("box", "vmid", "proxmox_host", "connection", "root")))
    console().print(t)


@inventory.command("show")
@click.argument("box")
@json_option
@click.pass_context
def show(ctx: click.Context, box: str, as_json: bool) -> None:
    """Show every resolved variable of BOX and of its Proxmox host."""
    b = state(ctx).inventory.box(box)
    doc = {
        "box": b.name,
        "vmid": b.vmid,
        "container": {
            "name": b.container.name,
            "groups": b.container.groups,
            "vars": b.container.public_vars(),
        },
        "proxmox_host": {"name": b.host.name, "groups": b.host.groups, "vars": b.host.public_vars()},
    }
    if as_json:
        print_json(doc)
        return
    con = console()
    for part in ("container", "proxmox_host"):
        groups = ", ".join(doc[part]["groups"]) or "-"
        t = Table(title=escape(f"{part}: {doc[part]['name']} (groups: {groups})"))
        t.add_column("variable")
        t.add_column("value", overflow="fold")
        for k, v in doc[part]["vars"].items():
            t.add_row(plain(k), plain(_short(v)))
        con.print(t)


def _short(v) -> str:
    import yaml

    if isinstance(v, (dict, list)):
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip()
    return str(v)
