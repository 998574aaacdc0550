"""Text from documents, inventories and servers, made safe for where it is shown: one place each.

- `terminal`: control characters (C0, DEL, C1 such as the CSI introducer U+009B) and the bidi
  overrides/isolates ("Trojan Source", CVE-2021-42574) become visible `\\xNN`/`\\u202e` escapes,
  so a stored field or a server's error cannot move the cursor, recolour the terminal or retitle
  the window (ECMA-48 sections 5 and 8.3).
- `rich`: rich markup (`[bold]`, `[/]`) is shown as written (rich.markup.escape), after `terminal`.
- `mathtext`: matplotlib parses text between two unescaped `$` as mathtext; `$\\frac{$` in a
  label raised a ValueError at draw time. `\\$` is matplotlib's literal dollar.
- LaTeX, Markdown and HTML have their one escaper each next to their renderer:
  `gpubox.bench.report.latex.tex_escape`, `gpubox.bench.report.markdown.md_escape`, and jinja2's
  autoescape for HTML (markupsafe), applied as the templates' finalize hook to every value.
"""

from __future__ import annotations

import re

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "]")
_CONTROL_NL = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + "]")


def _show(m: re.Match) -> str:
    c = m.group(0)
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def terminal(text, *, newlines: bool = False, limit: int | None = None) -> str:
    """TEXT with every control character shown as an escape (newline and tab kept when NEWLINES)."""
    s = str(text)
    if limit is not None and len(s) > limit:
        s = s[: max(0, limit - 3)] + "..."
    return (_CONTROL if newlines else _CONTROL_NL).sub(_show, s)


def rich(text, **kw) -> str:
    """TEXT for a rich markup string: terminal-safe and with markup shown as written."""
    from rich.markup import escape as _rich_escape

    return _rich_escape(terminal(text, **kw))


def mathtext(text) -> str:
    """TEXT for a matplotlib label, title or legend entry: no mathtext, no control characters."""
    return terminal(text).replace("$", r"\$")
