"""`gpubox autostart install|status|remove BOX`: the box comes back healthy after a reboot by itself
(docs/autostart.md). `hook` and `boot` are what the hookscript and the boot unit run."""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from gpubox.clihelp import ask, box_context, emit, json_option
from gpubox.output import console, render_report
from gpubox.pipeline import run_steps


def _spec(c, **cli):
    from ..autostart import spec_from

    inv = c.inventory.path if c.inventory is not None else None
    return spec_from(c.box, str(inv) if inv else None, **cli)


@click.group()
def autostart() -> None:
    """Reboot without a command: a boot unit and a Proxmox hookscript run gpubox's own steps."""


@autostart.command()
@click.argument("box")
@click.option(
    "--policy",
    type=click.Choice(["refuse", "degrade"]),
    default=None,
    help="pre-start when the box cannot be made right (default degrade: start and report).",
)
@click.option(
    "--storage", default=None, help="Storage with snippets content for the hookscript (default local)."
)
@click.option(
    "--server-unit",
    default=None,
    metavar="UNIT",
    help="The inference server's unit in the container: started by gpubox after staging.",
)
@click.option(
    "--existing",
    type=click.Choice(["chain", "refuse"]),
    default=None,
    help="A hookscript of yours already attached: chain it (default) or refuse.",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the snippet, the unit files and the pct set argv; change nothing."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask before attaching the hookscript.")
@json_option
@click.pass_context
def install(ctx, box, policy, storage, server_unit, existing, dry_run, yes, as_json) -> None:
    """Install the boot unit and the hookscript of BOX (idempotent)."""
    from ..autostart_step import InstallStep

    c = box_context(ctx, box, as_json=as_json, dry_run=dry_run)
    try:
        spec = _spec(c, policy=policy, storage=storage, server_unit=server_unit, existing=existing)
        step = InstallStep(spec)
        if not dry_run and not yes and sys.stdin.isatty():
            if not ask(f"attach a gpubox hookscript to CT {spec.vmid} and enable {spec.unit}?"):
                raise click.exceptions.Exit(1)
        report = run_steps(c, [step], "plan" if dry_run else "apply")
    finally:
        c.close()
    if dry_run and not as_json:
        _print_dry_run(report, box)
    emit(report, as_json, title=f"gpubox autostart install {box}" + (" (dry run)" if dry_run else ""))


def _print_dry_run(report, box: str) -> None:
    """Every file in full (the snippet, the unit, the gate), then each command (the pct set argv)."""
    con = console()
    for s in report.steps:
        if s.diff:
            con.print(escape(s.diff), soft_wrap=True)
    render_report(report, con, show_changes=False, title=f"gpubox autostart install {box} (dry run)")
    for s in report.steps:
        for argv in s.commands:
            con.print("  would run: " + escape(" ".join(argv)), soft_wrap=True)
    sys.exit(report.exit_code)


@autostart.command()
@click.argument("box")
@json_option
@click.pass_context
def status(ctx, box, as_json) -> None:
    """Is BOX reboot-safe? (exit 1: no)"""
    from ..autostart_step import InstallStep

    c = box_context(ctx, box, as_json=as_json)
    try:
        report = run_steps(c, [InstallStep(_spec(c))], "check")
    finally:
        c.close()
    emit(report, as_json, title=f"gpubox autostart status {box}")


@autostart.command()
@click.argument("box")
@click.option("--dry-run", is_flag=True, help="Show what would be restored, disabled and deleted.")
@json_option
@click.pass_context
def remove(ctx, box, dry_run, as_json) -> None:
    """Detach the hookscript (the previous one, or none, put back) and delete the unit and snippet."""
    from ..autostart_step import RemoveStep

    c = box_context(ctx, box, as_json=as_json, dry_run=dry_run)
    try:
        report = run_steps(c, [RemoveStep(_spec(c))], "plan" if dry_run else "apply")
    finally:
        c.close()
    emit(report, as_json, title=f"gpubox autostart remove {box}" + (" (dry run)" if dry_run else ""))


@autostart.command(hidden=True)
@click.argument("box")
@click.argument("vmid")
@click.argument("phase")
@click.option("--chain", default=None, help="The user's hookscript, run first with the same argv.")
@click.option("--policy", type=click.Choice(["refuse", "degrade"]), default=None)
@click.option("--server-unit", default=None)
@click.pass_context
def hook(ctx, box, vmid, phase, chain, policy, server_unit) -> None:
    """What the hookscript runs: `<script> <vmid> <phase>` (Proxmox's argv)."""
    from ..autostart_hook import hook as run_hook

    c = box_context(ctx, box, as_json=True, restart="never", persist=True, yes=True)
    try:
        rc = run_hook(c, _spec(c, policy=policy, server_unit=server_unit), vmid, phase, chain)
    finally:
        c.close()
    sys.exit(rc)


@autostart.command(hidden=True)
@click.argument("box")
@click.option("--after-start", is_flag=True, help="Wait until the start task releases the config's lock.")
@click.pass_context
def boot(ctx, box, after_start) -> None:
    """What the boot unit runs, before pve-guests starts the onboot containers."""
    from ..autostart_hook import boot as run_boot

    c = box_context(ctx, box, as_json=True, restart="never", persist=True, yes=True)
    try:
        rc = run_boot(c, _spec(c), after_start)
    finally:
        c.close()
    sys.exit(rc)
