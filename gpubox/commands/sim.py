"""`gpubox sim create DIR [--fault F ...]` / `gpubox sim rm DIR`: build (and remove) a simulated box
to try gpubox on; `gpubox sim reboot DIR [--driver-upgrade]` replays a host reboot on it."""

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


@sim.command("reboot")
@click.argument("dest", type=click.Path(file_okay=False, exists=True))
@click.option(
    "--driver-upgrade", is_flag=True, help="The NVIDIA driver was upgraded: nvidia-uvm gets a new major."
)
@json_option
def reboot_(dest: str, driver_upgrade: bool, as_json: bool) -> None:
    """Replay a Proxmox host reboot on the simulated box in DEST, with each phase's time."""
    from pathlib import Path

    from ..errors import GpuboxError
    from ..simbox import reboot as rb

    if not Path(dest, "sim.json").is_file():
        raise GpuboxError(
            f"{dest} is not a simulated box (no sim.json)", "make one with gpubox demo --keep DIR"
        )
    out = rb.reboot(dest, driver_upgrade)
    if as_json:
        print_json(out.to_dict())
        return
    from rich.markup import escape

    from ..output import console

    con = console()
    from ..escape import terminal

    for line in out.log:  # the hooks' own output: escaped before it reaches the terminal
        con.print(f"  [dim]{escape(terminal(line))}[/]", soft_wrap=True)
    for p in out.phases:
        con.print(f"{p.seconds:7.2f} s  {escape(p.name)}: {escape(p.detail)}", soft_wrap=True)
    if out.healthy_after is not None:
        con.print(f"power on -> healthy verdict, no command typed: {out.healthy_after:.1f} s")
    elif out.verdict:
        con.print(f"the post-start health check says {escape(out.verdict)}: run gpubox doctor")
    else:
        con.print(
            "no health check ran: nothing is automatic (gpubox autostart install BOX); run gpubox doctor"
        )


def load_for(inventory) -> None:
    """Load the simulator when the inventory names a simulated host, so that host's files follow
    the simulated box's rules (its /etc/pve is pmxcfs: gpubox.simbox.pmxcfs)."""
    if any(h.get("gpubox_simulated") is True for h in inventory.hosts.values()):
        import gpubox.simbox  # noqa: F401 - registers the simulated box's file rules
