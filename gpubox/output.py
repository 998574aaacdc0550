"""Rendering: rich tables for people, JSON for machines."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.segment import Segment
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from .steps import DRIFT, FAILED, FIXED, OK, SKIPPED, RunReport

STYLE = {OK: "green", FIXED: "cyan", DRIFT: "yellow", FAILED: "bold red", SKIPPED: "dim"}


# Width when the output is no terminal (a file, a pipe, cron mail) and COLUMNS is not set: rich
# would take 80 there. Tables wrap to this width at spaces, but a word longer than its cell (a
# path, a command line) is never split there: the table grows as wide as its longest word needs
# (OutputConsole.print), and a line printed outside a table is never wrapped at all, so what a
# person copies or a script greps is whole. On a terminal, or with COLUMNS set, the width is the
# terminal's and cells fold to fit (never "…").
PIPE_WIDTH = 160


class OutputConsole(Console):
    """A rich Console that never loses text: tables fold their cells where a column is too narrow
    (rich's default is to cut them with an ellipsis), at any width.

    It is also the terminal boundary: every piece of text it writes, whatever field or table it
    came from, passes gpubox.escape.terminal at render time (`_render_buffer`), so an escape
    sequence or a bidi override in a new field cannot reach the terminal even where the caller
    forgot `plain()`. Rich's own styling is added after that, as control codes of its own. Markup
    that does not parse (`[/x]` from a stored field in a markup string) prints the string as
    written instead of ending the command with an internal error."""

    def __init__(self, *a: Any, piped: bool = False, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.piped = piped  # no terminal: never split a word (see PIPE_WIDTH)

    def print(self, *objects: Any, **kw: Any) -> None:
        for o in objects:
            if isinstance(o, Table):
                fold(o)
        width = self.width
        try:
            try:
                self._fit(objects, width, kw)
                super().print(*objects, **kw)
            except MarkupError:
                objects = tuple(_defused(o) for o in objects)
                self._fit(objects, width, kw)
                super().print(*objects, **kw)
        finally:
            self.width = width  # rich clamps print(width=) to the console's: widen it for one print only

    def _fit(self, objects, width: int, kw: dict) -> None:
        """Piped: the console as wide as the longest unbreakable word of a table needs (a path or a
        command is never split), else PIPE_WIDTH."""
        tables = [o for o in objects if isinstance(o, Table)]
        if self.piped and tables:
            wide = self.options.update_width(1 << 16)  # measured unclamped by this width
            self.width = max([width] + [self.measure(t, options=wide).minimum for t in tables])
            kw.setdefault("soft_wrap", False)

    def _render_buffer(self, buffer) -> str:
        from .escape import terminal

        safe = [
            seg if seg.control or not seg.text else Segment(terminal(seg.text, newlines=True), seg.style)
            for seg in buffer
        ]
        return super()._render_buffer(safe)


def _markup(value: Any) -> Any:
    """A markup string as rich would render it, or the string as written where its markup does
    not parse (a `[/x]` that came from a document)."""
    if not isinstance(value, str):
        return value
    try:
        return Text.from_markup(value)
    except MarkupError:
        return Text(value)


def _defused(obj: Any) -> Any:
    """OBJ with every markup string that does not parse (top level, or a table's title, caption,
    headers and cells) replaced by its text as written; valid markup is kept."""
    if isinstance(obj, Table):
        obj.title, obj.caption = _markup(obj.title), _markup(obj.caption)
        for c in obj.columns:
            c.header, c.footer = _markup(c.header), _markup(c.footer)
            c._cells = [_defused(x) for x in c._cells]
        return obj
    return _markup(obj)


def fold(t: Table) -> Table:
    """Every column of `t` wraps (fold) instead of cutting; headers too."""
    for c in t.columns:
        if c.overflow in ("ellipsis", "crop"):
            c.overflow = "fold"
        c.no_wrap = False
    return t


def console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    piped = not tty and not os.environ.get("COLUMNS")
    if piped:
        width = PIPE_WIDTH
    return OutputConsole(stderr=stderr, highlight=False, soft_wrap=piped, width=width, piped=piped)


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
                con.print(
                    Syntax(s.diff, "diff", theme="ansi_dark", background_color="default", word_wrap=True)
                )
            for argv in s.commands:
                con.print("  $ " + escape(" ".join(_q(a) for a in argv)))
    con.print(recap_line(report))


def recap_line(report: RunReport) -> str:
    """The last line of every run, like Ansible's PLAY RECAP: the counts, then the verdict.
    Skipped steps are counted apart and said, never folded into ok."""
    counts = report.recap()
    parts = " ".join(f"{k}={v}" for k, v in counts.items())
    if report.ok:
        verdict = "[green]ok[/]"
        if counts["skipped"]:
            verdict += f" [dim]({counts['skipped']} skipped: not checked, not counted as ok)[/]"
    elif report.steps and all(s.status == SKIPPED for s in report.steps):
        verdict = "[yellow]nothing checked[/] (every step skipped)"
    else:
        verdict = "[red]problems remain[/]"
    return f"{escape(report.box)}: {verdict} ({report.seconds:.2f} s) recap: {parts}"


def _q(a: str) -> str:
    import shlex

    return shlex.quote(a)
