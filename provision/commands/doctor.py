"""`gpubox doctor BOX`: every step checked, read-only (provision/recover.py `doctor`)."""

from __future__ import annotations

import sys

import click
from rich.markup import escape

from gpubox.clihelp import box_context, json_option, only_option, skip_option
from gpubox.output import console, print_json, render_report


@click.command()
@click.argument("box")
@skip_option
@only_option
@click.option(
    "--persist/--no-persist",
    default=True,
    show_default=True,
    help="Also check that host repairs survive the next reboot (as recover makes them).",
)
@json_option
@click.pass_context
def doctor(ctx: click.Context, box: str, skip, only, persist: bool, as_json: bool) -> None:
    """Check everything on BOX, read-only: one table with the cause and repair of each problem."""
    from ..recover import doctor as run_doctor

    c = box_context(ctx, box, as_json=as_json, persist=persist)
    try:
        report = run_doctor(c, skip, only)
        from ..autostart_step import reboot_safe

        safe, why = reboot_safe(c)  # a summary line, not a step: no autostart is no fault of the box
    finally:
        c.close()
    if as_json:
        print_json(dict(report.to_dict(), reboot_safe={"ok": safe, "detail": why}))
    else:
        render_report(report, console(), title=f"gpubox doctor {box}", show_changes=False)
        console().print(
            f"reboot-safe: {escape(why)}" + ("" if safe else f" (gpubox autostart install {escape(box)})")
        )
    sys.exit(report.exit_code)
