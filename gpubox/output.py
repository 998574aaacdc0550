"""Rendering: rich tables for people, JSON for machines."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from .steps import DRIFT, FAILED, FIXED, OK, SKIPPED, RunReport

STYLE = {OK: "green", FIXED: "cyan", DRIFT: "yellow", FAILED: "bold red", SKIPPED: "dim"}


def console(stderr: bool = False) -> Console:
    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def plain(value: Any) -> Text:
    """User data (inventory values, paths, names, remote output) for a rich table cell or print:
    a Text is never parsed as markup, so `[/path]` or `[bold]` in a value is shown as written, and
    control characters (an ESC sequence in a stored field or a server's error) are shown escaped
    (gpubox.escape.terminal; rich strips only BEL/BS/VT/FF/CR)."""
    from .escape import terminal

    return Text(terminal(value, newlines=True))


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def render_report(
    report: RunReport, con: Console | None = None, *, show_changes: bool = True, title: str | None = None
) -> None:
    con = con or console()
    t = Table(title=escape(title or f"{report.box}: {report.mode}"), show_lines=False)
    t.add_column("step")
    t.add_column("host")
    t.add_column("status")
    t.add_column("detail", overflow="fold")
    t.add_column("s", justify="right")
    for s in report.steps:
        st = STYLE.get(s.status, "")
        detail = escape(s.detail)
        if s.status in (DRIFT, FAILED) or (s.status == SKIPPED and s.evidence.get("blocked_by")):
            if s.cause:
                detail += f"\n[dim]cause:[/] {escape(s.cause)}"
            if s.repair:
                detail += f"\n[dim]repair:[/] {escape(s.repair)}"
        t.add_row(plain(s.name), plain(s.host), f"[{st}]{s.status}[/]", detail, f"{s.seconds:.2f}")
    con.print(t)
    if show_changes:
        for s in report.steps:
            if not (s.diff or s.commands):
                continue
            verb = "changed" if s.changed else "would change"
            con.print(f"[bold]{escape(s.name)}[/] ({escape(s.host)}) {verb}:")
            if s.diff:
                con.print(Syntax(s.diff, "diff", theme="ansi_dark", background_color="default"))
            for argv in s.commands:
                con.print("  $ " + escape(" ".join(_q(a) for a in argv)))
    verdict = "[green]ok[/]" if report.ok else "[red]problems remain[/]"
    con.print(f"{escape(report.box)}: {verdict} ({report.seconds:.2f} s)")


def _q(a: str) -> str:
    import shlex

    return shlex.quote(a)
