"""`gpubox lxc check BOX` and `gpubox lxc fix BOX`: GPU access of the LXC container."""

from __future__ import annotations

import sys

import click

from gpubox.clihelp import ask, box_context, dry_run_option, emit, json_option
from gpubox.clihelp import persist_option as persist_opt
from gpubox.pipeline import run_steps


@click.group()
def lxc() -> None:
    """GPU access of the LXC container: host device nodes, container config, CUDA inside."""


def steps(ctx) -> list:
    """The `lxc` group's steps (host-devices, container-config, container, cuda), in pipeline order."""
    from .. import container_config_step, container_step, cuda_step, host_devices_step

    return [
        s for m in (host_devices_step, container_config_step, container_step, cuda_step) for s in m.steps(ctx)
    ]


def _run(click_ctx, box: str, mode: str, **options) -> None:

    # No checks of its own: bad API settings, gpubox_device_mode and --restart are the steps'
    # options, checked by the engine before anything runs (exit 2), as for recover and Ansible.
    ctx = box_context(click_ctx, box, **options)
    con = ctx.console
    try:
        if con is not None:
            with con.status(f"{box}: {mode}...") as status:
                report = run_steps(
                    ctx, steps(ctx), mode, on_result=lambda r: status.update(f"{box}: {r.name} {r.status}")
                )
        else:
            report = run_steps(ctx, steps(ctx), mode)
    finally:
        ctx.close()
    emit(report, options.get("as_json", False), title=f"{box}: lxc {mode}")


@lxc.command("check")
@click.argument("box")
@persist_opt("Also check that the host makes the uvm nodes at every boot.")
@json_option
@click.pass_context
def check(click_ctx, box: str, persist: bool, as_json: bool) -> None:
    """Check the host's NVIDIA nodes, the container config, the container and CUDA inside it.

    Exit 0 when CUDA works in the container, 1 when something needs repair."""
    _run(click_ctx, box, "check", persist=persist, as_json=as_json)


@lxc.command("fix")
@click.argument("box")
@dry_run_option
@click.option(
    "--restart",
    type=click.Choice(["auto", "never", "always"]),
    default="auto",
    show_default=True,
    help="auto: restart the container only when live-applying the rules is not enough.",
)
@click.option("--yes", is_flag=True, help="Restart without asking when a restart is needed.")
@persist_opt("Also make the host create the uvm nodes at every boot.")
@json_option
@click.pass_context
def fix(click_ctx, box: str, dry_run: bool, restart: str, yes: bool, persist: bool, as_json: bool) -> None:
    """Repair what `check` finds: nodes, config (safe write), live rules or restart."""
    confirm = None
    if not as_json and not yes and sys.stdin.isatty():

        def confirm(question: str) -> bool:
            return ask(question)

    _run(
        click_ctx,
        box,
        "plan" if dry_run else "apply",
        dry_run=dry_run,
        restart=restart,
        yes=yes,
        persist=persist,
        as_json=as_json,
        confirm=confirm,
    )
