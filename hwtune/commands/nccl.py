"""`gpubox nccl ...`: the NCCL environment profiles (hwtune/nccl.py): list, show, export, check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from gpubox.clihelp import json_option, nccl_profile_option
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json


@click.group()
def nccl() -> None:
    """NCCL environment profiles: list, show, export, check."""


def _issue_lines(issues) -> list[str]:
    return [f"{i.level}: {i}" for i in issues]


@nccl.command("profiles")
@json_option
def nccl_profiles(as_json):
    """List the profiles (shipped, ~/.config/gpubox/nccl-profiles, $GPUBOX_NCCL_PROFILES)."""
    from ..nccl import list_profiles

    profiles = list_profiles()
    if as_json:
        print_json({n: p.to_dict() for n, p in sorted(profiles.items())})
        return
    t = Table(title="NCCL profiles")
    for col in ("name", "variables", "warnings", "description"):
        t.add_column(col, overflow="fold")
    for n, p in sorted(profiles.items()):
        t.add_row(
            n,
            escape(" ".join(f"{k}={v}" for k, v in p.env.items())),
            str(sum(i.level == "warning" for i in p.issues)),
            escape(p.description),
        )
    console().print(t)


@nccl.command("show")
@click.argument("name")
@json_option
def nccl_show(name, as_json):
    """Show one profile with its validation warnings."""
    from ..nccl import load_profile

    p = load_profile(name)
    if as_json:
        print_json(p.to_dict())
        return
    con = console()
    con.print(f"[bold]{escape(p.name)}[/]  ({escape(p.path)})\n{escape(p.description)}")
    if p.notes:
        con.print(f"[dim]{escape(p.notes)}[/]")
    for k, v in p.env.items():
        con.print(f"  {k}={escape(v)}")
    for line in _issue_lines(p.issues):
        con.print(f"  [yellow]{escape(line)}[/]")


@nccl.command("export")
@nccl_profile_option(help_text="Profile name or YAML file [default: pcie-2numa].")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["shell", "envfile", "docker", "ncclconf", "json"]),
    default="shell",
    show_default=True,
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write to FILE (atomically) instead of stdout."
)
def nccl_export(nccl_profile, fmt, output):
    """Export a profile: shell `export K=V`, systemd EnvironmentFile, docker --env-file, nccl.conf, JSON."""
    from ..nccl import load_profile, render

    p = load_profile(nccl_profile or "pcie-2numa")
    header = None if fmt == "json" else f"NCCL profile {p.name}, exported by gpubox ({fmt})"
    text = render(p.env, fmt, header=header)
    for line in _issue_lines(p.issues):
        click.echo(f"gpubox: {line}", err=True)
    if not output:
        sys.stdout.write(text)
        return
    path = Path(output)
    from gpubox.safeio import write_text

    write_text(path, text)  # a new temp renamed over it: a link there is replaced, not followed


@nccl.command("check")
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--env", "use_env", is_flag=True, help="Check the NCCL_* variables of the current environment.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "shell", "envfile", "docker", "ncclconf", "json"]),
    default="auto",
    show_default=True,
)
@json_option
def nccl_check(file, use_env, fmt, as_json):
    """Validate an env file (any export format) or the environment: unknown names with a
    did-you-mean, bad values, debug-class and deprecated names. Exit 1 on errors."""
    from ..nccl import detect_format, errors, parse, validate

    if bool(file) == bool(use_env):
        raise GpuboxError("give exactly one of FILE or --env", "e.g. gpubox nccl check /etc/gpubox/nccl.env")
    unsafe = []
    if use_env:
        env, source, only_nccl = (
            {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
            "environment",
            True,
        )
    else:
        from gpubox.readlimit import read_text_file

        from ..nccl import Issue, unsafe_lines

        text = read_text_file(file, what="NCCL env file")
        fmt = detect_format(text, file) if fmt == "auto" else fmt
        env, source, only_nccl = parse(text, fmt), f"{file} ({fmt})", fmt not in ("json",)
        env = {
            k: v for k, v in env.items() if not only_nccl or k.strip().startswith("NCCL_") or k != k.strip()
        }
        if fmt in ("shell", "envfile"):  # what `set -a; . FILE` would run or expand, not just assign
            unsafe = [
                Issue(
                    "error",
                    f"line {no}",
                    f"{line.strip()[:80]!r}: a shell sourcing this file "
                    "would not read a plain value (unquoted metacharacter); quote it as "
                    "`gpubox nccl export` does",
                )
                for no, line in unsafe_lines(text)
            ]
    issues = unsafe + validate(env, only_nccl=only_nccl)
    bad = errors(issues)
    if as_json:
        print_json(
            {
                "source": source,
                "ok": not bad,
                "env": env,
                "issues": [
                    {"level": i.level, "name": i.name, "message": i.message, "suggestion": i.suggestion}
                    for i in issues
                ],
            }
        )
    else:
        con = console()
        con.print(f"{escape(source)}: {len(env)} NCCL variable(s)")
        for i in issues:
            con.print(f"  [{'red' if i.level == 'error' else 'yellow'}]{i.level}[/]: {escape(str(i))}")
        con.print("[green]ok[/]" if not bad else f"[red]{len(bad)} error(s)[/]")
    sys.exit(1 if bad else 0)
