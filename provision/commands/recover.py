"""`gpubox recover BOX`: diagnose, repair, then prove it with the benchmark (provision/recover.py)."""

from __future__ import annotations

import sys

import click

from gpubox.clihelp import ask, box_context, json_option, only_option, skip_option
from gpubox.output import print_json


@click.command()
@click.argument("box")
@click.option(
    "--dry-run", is_flag=True, help="Check and plan every step; print every diff and command; change nothing."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask before restarting the container.")
@skip_option
@only_option
@click.option("--no-bench", is_flag=True, help="Repair only; skip the verification benchmark.")
@click.option("--profile", default=None, help="Benchmark profile (default: the box's, else health).")
@click.option("--restart", type=click.Choice(["auto", "never", "always"]), default="auto", show_default=True)
@click.option(
    "--persist/--no-persist",
    default=True,
    show_default=True,
    help="Also make host repairs survive the next reboot (modules-load, udev, sysctl.d, oneshot unit).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Where results and the report go.")
@click.option(
    "--format", "report_format", type=click.Choice(["md", "html", "latex"]), default="md", show_default=True
)
@json_option
@click.pass_context
def recover(
    ctx: click.Context,
    box: str,
    dry_run,
    yes,
    skip,
    only,
    no_bench,
    profile,
    restart,
    persist,
    out_dir,
    report_format,
    as_json,
) -> None:
    """Diagnose and repair BOX after a reboot, then prove it with the verification benchmark."""
    from ..recover import recover as run_recover
    from ..recover import render_outcome

    confirm = None
    if not yes and not dry_run and sys.stdin.isatty():

        def confirm(question: str) -> bool:  # the container restart asks first unless --yes
            return ask(question)

    c = box_context(
        ctx,
        box,
        as_json=as_json,
        dry_run=dry_run,
        yes=yes,
        restart=restart,
        persist=persist,
        bench_profile=profile,
        confirm=confirm,
    )
    try:
        outcome = run_recover(
            c,
            dry_run=dry_run,
            skip=skip,
            only=only,
            bench=not no_bench,
            profile=profile,
            out_dir=out_dir,
            report_format=report_format,
        )
    finally:
        c.close()
    if as_json:
        print_json(outcome.to_dict())
    else:
        render_outcome(outcome, f"gpubox recover {box}" + (" --dry-run" if dry_run else ""))
    sys.exit(outcome.exit_code)
