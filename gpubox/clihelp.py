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
skip_option = click.option(
    "--skip", multiple=True, metavar="STEP", help="Skip a step or group (repeat or comma-separate)."
)
only_option = click.option("--only", multiple=True, metavar="STEP", help="Run only these steps or groups.")


def persist_option(help_text: str = "Host repairs survive the next reboot (boot files)."):
    return click.option("--persist/--no-persist", default=PERSIST_DEFAULT, show_default=True, help=help_text)


def _old_profile(ctx, param, value):
    if value is not None:
        raise click.UsageError(
            f"--profile is the benchmark profile; give the NCCL profile as --nccl-profile {value}", ctx
        )
    return value


def nccl_profile_option(default: str | None = None, help_text: str = "NCCL profile name or YAML file."):
    """`--nccl-profile P`, the one name of the NCCL profile on every command (`--profile` is the
    benchmark profile everywhere); the old spelling `--profile` here gets a usage error that says
    so, instead of being taken as the other profile."""

    def deco(f):
        f = click.option(
            "--profile", "old_profile", default=None, hidden=True, expose_value=False, callback=_old_profile
        )(f)
        return click.option(
            "--nccl-profile",
            "nccl_profile",
            default=default,
            show_default=default is not None,
            help=help_text,
        )(f)

    return deco


def ask(question: str) -> bool:
    """A yes/no prompt (default no). Ctrl-C at it is an interrupt of the whole run (exit 130 with
    what was changed), not an answer and not a step failure: click's Abort becomes
    KeyboardInterrupt, which the step engine does not catch."""
    try:
        return click.confirm(question, default=False, err=True)
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None


def state(ctx: click.Context):
    return ctx.find_root().obj


def box_context(ctx: click.Context, box_name: str, **options: Any) -> Context:
    st = state(ctx)
    inv = st.inventory
    box = inv.box(box_name)
    quiet = options.get("as_json", False)
    root = ctx.find_root()
    if root.get_parameter_source("inventory") == click.core.ParameterSource.COMMANDLINE:
        options.setdefault("inventory_arg", st.inventory_path)  # repair hints repeat it
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
