"""Shared pieces for subcommands: the box argument, --json, contexts, report output and exit."""

from __future__ import annotations

import sys
from typing import Any

import click

from .context import PERSIST_DEFAULT, Context
from .output import console, print_json, render_report
from .steps import RunReport

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for machines.")
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Check and plan only: show the exact diff/commands, change nothing."
)


def persist_option(help_text: str = "Host repairs survive the next reboot (boot files)."):
    return click.option("--persist/--no-persist", default=PERSIST_DEFAULT, show_default=True, help=help_text)


def state(ctx: click.Context):
    return ctx.find_root().obj


def box_context(ctx: click.Context, box_name: str, **options: Any) -> Context:
    st = state(ctx)
    inv = st.inventory
    box = inv.box(box_name)
    quiet = options.get("as_json", False)
    return Context(
        box=box,
        inventory=inv,
        options=options,
        verbose=bool(st.verbose),
        console=None if quiet else console(stderr=True),
    )


def emit(report: RunReport, as_json: bool, *, title: str | None = None) -> None:
    """Print the report and exit with its status (0 ok, 1 problems remain)."""
    if as_json:
        print_json(report.to_dict())
    else:
        render_report(report, console(), title=title)
    sys.exit(report.exit_code)
