"""Markdown and self-contained HTML renderers (no TeX needed).

Both go through jinja2 templates: Markdown with every value backslash-escaped (CommonMark lets any
ASCII punctuation be escaped), HTML with jinja's own autoescape and the plots inlined as base64 PNG
so the one file can be mailed or attached to a ticket.
"""

from __future__ import annotations

import base64
from pathlib import Path

import jinja2
from markupsafe import Markup

from gpubox.escape import terminal

from .latex import TEMPLATES

_MD_SPECIAL = set("\\`*_[]<>|#~$^&")


class MdSafe(Markup):
    """A string already in Markdown; joining plain strings onto it escapes them with md_escape."""

    __slots__ = ()

    @classmethod
    def escape(cls, s) -> "MdSafe":
        return s if isinstance(s, MdSafe) else cls(md_escape(s))


def md_escape(value) -> str:
    """Plain text -> Markdown that shows exactly that text (inline; newlines become spaces)."""
    if isinstance(value, MdSafe):
        return str(value)
    text = terminal(str(value).replace("\r", " ").replace("\n", " "))  # ESC, C1, bidi: shown escaped
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in text)


def md_code_block(value) -> MdSafe:
    """A fenced block whose fence is longer than any backtick run inside (CommonMark rule)."""
    text = terminal(value, newlines=True)  # a log tail in a block: control characters shown escaped
    run = longest = 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return MdSafe(f"{fence}\n{text}\n{fence}")


def _md_finalize(value):
    if value is None:
        return ""
    return value if isinstance(value, MdSafe) else md_escape(value)


def _md_cell(c) -> MdSafe:
    if c.status == "failed":
        return MdSafe("**failed**")
    if c.status == "skipped":
        return MdSafe("*skipped*")
    if c.status == "missing" and c.text == "--":
        return MdSafe("–")
    return MdSafe(md_escape(c.text))


def _align(table) -> MdSafe:
    out = []
    for j, _ in enumerate(table.columns):
        col = [r[j] for r in table.rows if j < len(r)]
        out.append(":--" if col and all(c.status == "label" for c in col) else "--:")
    return MdSafe("|" + "|".join(out) + "|")


LEVEL_MD = {"good": "✅", "warn": "⚠️", "info": "ℹ️"}


def md_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_md_finalize,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters.update(
        cell=_md_cell,
        align=_align,
        block=md_code_block,
        raw=lambda s: MdSafe(s),
        level=lambda lv: MdSafe(LEVEL_MD.get(lv, "-")),
    )
    return env


def _html_finalize(value):
    """Every value a template prints: control characters and bidi overrides shown escaped, before
    jinja's autoescape (markupsafe) escapes the HTML; Markup the templates built is left alone."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return terminal(value, newlines=True)
    return value


def html_environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_html_finalize,
        undefined=jinja2.StrictUndefined,
    )


def render_markdown(report, outdir: Path, figures: list) -> Path:
    env = md_environment()
    figs = [
        {
            "title": f.title,
            "caption": f.caption,
            "compare": f.id.startswith("compare-"),
            "src": MdSafe(f.path.relative_to(outdir).as_posix()),
        }
        for f in figures
    ]
    text = env.get_template("report.md.j2").render(report=report, figures=figs, multi=len(report.runs) > 1)
    out = outdir / "report.md"
    out.write_text(text, encoding="utf-8")
    return out


def render_html(report, outdir: Path, figures: list) -> Path:
    env = html_environment()
    figs = [
        {
            "title": f.title,
            "caption": f.caption,
            "compare": f.id.startswith("compare-"),
            "src": "data:image/png;base64," + base64.b64encode(f.path.read_bytes()).decode("ascii"),
        }
        for f in figures
    ]
    text = env.get_template("report.html.j2").render(report=report, figures=figs, multi=len(report.runs) > 1)
    out = outdir / "report.html"
    out.write_text(text, encoding="utf-8")
    return out
