"""`gpubox sim create DIR [--fault F ...]` / `gpubox sim rm DIR`: build (and remove) a simulated box
to try gpubox on."""

from __future__ import annotations

import click

from ..clihelp import json_option
from ..output import print_json


@click.group()
def sim() -> None:
    """Simulated boxes (for trying gpubox and for tests)."""


@sim.command("create")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option(
    "--fault", "faults", multiple=True, help="Fault to reproduce (repeat); 'seed' = the seed's reboot."
)
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 16))
@json_option
def create(dest: str, faults: tuple[str, ...], gpus: int, as_json: bool) -> None:
    """Create a simulated Proxmox host + container in DEST and write its inventory."""
    from ..simbox import build

    box = build(dest, faults, gpus=gpus)
    doc = {"dir": str(box.dest), "inventory": str(box.inventory_path), "faults": sorted(box.faults)}
    from ..simbox import lxcreal

    doc["container_runtime"] = lxcreal.runtime().describe()  # real LXC where it can run (docs/lxc.md)
    if as_json:
        print_json(doc)
    else:
        click.echo(
            f"simulated box in {box.dest}\n  faults: {', '.join(doc['faults']) or 'none'}\n"
            f"  container: {doc['container_runtime']}\n"
            f"  try: gpubox -i {box.inventory_path} doctor {box.box}"
        )


@sim.command("faults")
@json_option
def faults_(as_json: bool) -> None:
    """List the fault switches."""
    from ..simbox import all_faults

    f = all_faults()
    if as_json:
        print_json(f)
    else:
        for k, v in sorted(f.items()):
            click.echo(f"{k:22} {v}")  # plain: descriptions hold "[pve:pending]", not rich markup


@sim.command("rm")
@click.argument("dest", type=click.Path(file_okay=False))
def rm(dest: str) -> None:
    """Remove a simulated box's directory (one `sim create` or `demo --keep` made; nothing else)."""
    from ..simbox import remove

    click.echo(f"removed {remove(dest)}")
