"""LaTeX rendering through a jinja2 template with LaTeX-safe delimiters, and PDF compilation.

Every value that reaches the template is escaped by `tex_escape` (the environment's finalize hook)
unless it is a `TexSafe` string built here from escaped parts, so a box name or server command
holding `_ % & # $ { } ~ ^ \\` prints as written instead of breaking the document.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from pathlib import Path

import jinja2
from markupsafe import Markup

from gpubox.errors import GpuboxError

TEMPLATES = Path(__file__).resolve().parent / "templates"

_TEX = {
    "\\": r"\textbackslash{}",
    "{": r"\{",
    "}": r"\}",
    "$": r"\$",
    "&": r"\&",
    "#": r"\#",
    "^": r"\textasciicircum{}",
    "_": r"\_",
    "~": r"\textasciitilde{}",
    "%": r"\%",
    "<": r"\textless{}",
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    '"': r"\textquotedbl{}",
    # characters that T1 fonts join into ligatures: `--` an en dash (a command's
    # --tensor-parallel-size), `---` an em dash, `<<`/`>>` and `,,` quotes, `` ` `` and `'` curly
    # quotes; an empty group after each keeps them the characters that were written
    "-": "-{}",
    ",": ",{}",
    "`": r"\textasciigrave{}",
    "'": r"\textquotesingle{}",
    # Unicode that findings use; anything else non-ASCII is transliterated or becomes '?', since
    # pdflatex stops on characters its fonts do not set up ("Unicode character ... not set up").
    "\u00d7": r"$\times$",
    "\u2192": r"$\rightarrow$",
    "\u2248": r"$\approx$",
    "\u2013": "--",
    "\u2014": "---",
    "\u2212": "$-$",
    "\u00b1": r"$\pm$",
    "\u2026": r"\ldots{}",
    "\u00b0": r"\textdegree{}",
    "\u2018": "`",
    "\u2019": "'",
    "\u201c": "``",
    "\u201d": "''",
    "\u00a0": "~",
}


class TexSafe(Markup):
    """A string already in LaTeX. Joining it with plain strings escapes those with tex_escape."""

    __slots__ = ()

    @classmethod
    def escape(cls, s) -> "TexSafe":
        if isinstance(s, TexSafe):
            return s
        return cls(tex_escape(s))


def tex_escape(value) -> str:
    """Plain text -> LaTeX source that typesets exactly that text.

    A long word (a path, `max_model_len`, `NCCL_P2P_NET_CHUNKSIZE=524288`) may break after its
    `/`, `_` and `=`, as a URL does: unbroken it runs into the margin."""
    if isinstance(value, TexSafe):
        return str(value)
    out = []
    for token in re.split(r"(\s+)", str(value)):
        breakable = len(token) >= _LONG_WORD
        for i, ch in enumerate(token):
            out.append(_tex_char(ch))
            if breakable and ch in "/_=" and 0 < i < len(token) - 1:
                out.append(_BREAK)
    return "".join(out)


# A break with the small penalty of an explicit hyphen's, printing nothing on either side.
_BREAK = r"\discretionary{}{}{}"
_LONG_WORD = 12


def _tex_char(ch: str) -> str:
    if ch in _TEX:
        return _TEX[ch]
    if ch == "\n":
        return " "
    if ord(ch) < 32 or ord(ch) == 127:
        return "?"
    if ord(ch) < 128:
        return ch
    plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return tex_escape(plain) if plain else "?"


def tex_code(value) -> TexSafe:
    """Escaped monospace text that may break after / , = and spaces (long server commands)."""
    s = tex_escape(value)
    for ch in ("/", ",", "="):
        s = s.replace(ch, ch + r"\allowbreak{}")
    return TexSafe(r"\texttt{" + s + "}")


def pdf_string(value) -> str:
    """ASCII letters, digits and a few marks: what PDF bookmarks can hold without warnings."""
    return (
        "".join(
            c if (c.isascii() and (c.isalnum() or c in " .,:;-+()/")) else " " for c in str(value)
        ).strip()
        or "run"
    )


def section_title(value) -> TexSafe:
    return TexSafe(r"\texorpdfstring{" + tex_escape(value) + "}{" + pdf_string(value) + "}")


def _finalize(value):
    if value is None:
        return ""
    if isinstance(value, TexSafe):
        return value
    return tex_escape(value)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        block_start_string=r"\BLOCK{",
        block_end_string="}",
        variable_start_string=r"\VAR{",
        variable_end_string="}",
        comment_start_string=r"\#{",
        comment_end_string="}",
        line_statement_prefix=None,
        line_comment_prefix="%#",
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        keep_trailing_newline=True,
    )
    env.filters.update(
        code=tex_code,
        sec=section_title,
        cell=cell_tex,
        colspec=colspec,
        level=level_mark,
        raw=lambda s: TexSafe(s),
    )
    return env


STATUS_TEX = {"failed": r"\textcolor{bad}{failed}", "skipped": r"\textcolor{dim}{skipped}", "missing": "--"}


def cell_tex(c) -> TexSafe:
    if c.status in STATUS_TEX and c.text in ("failed", "skipped", "--"):
        return TexSafe(STATUS_TEX[c.status])
    if c.status == "missing":
        return TexSafe(r"\textcolor{dim}{" + tex_escape(c.text) + "}")
    return TexSafe(tex_escape(c.text))


# Characters of small text on one line of the page (A4, 2 cm margins, 9 pt Helvetica): how wide
# a column of label text grows before it must wrap.
_LINE_CHARS = 100


def colspec(table) -> TexSafe:
    """l for label columns, r for numbers. When the label columns would not fit on the line
    together (a reason, a long measurement key), the long ones wrap: each gets a share of what
    the other columns leave, in proportion to its longest text (never into the margin)."""
    kinds, longest = [], []
    for j, _ in enumerate(table.columns):
        col = [r[j] for r in table.rows if j < len(r)]
        width = max([len(str(table.columns[j]))] + [len(c.text) for c in col])
        longest.append(width)
        if col and all(c.status == "label" for c in col):
            kinds.append("l")
        elif (
            col
            and all(c.status in ("label", "failed", "skipped") for c in col)
            and j < len(table.columns) - 1
        ):
            kinds.append("l")
        else:
            kinds.append("r")
    gaps = 2 * len(kinds)  # \tabcolsep on each side of each column, about a character each
    if sum(longest) + gaps <= _LINE_CHARS:
        return TexSafe("".join(kinds))
    wrap = [j for j, k in enumerate(kinds) if k == "l" and longest[j] > 16]
    fixed = sum(w for j, w in enumerate(longest) if j not in wrap) + gaps
    room = max(_LINE_CHARS - fixed, 10 * len(wrap))
    total = sum(longest[j] for j in wrap) or 1
    spec = []
    for j, k in enumerate(kinds):
        if j in wrap:
            share = round(0.97 * room * longest[j] / total / _LINE_CHARS, 2)
            spec.append(r">{\raggedright\arraybackslash}p{" + f"{share}" + r"\linewidth}")
        else:
            spec.append(k)
    return TexSafe("".join(spec))


LEVEL_TEX = {
    "good": r"\textcolor{good}{\textbullet}",
    "warn": r"\textcolor{bad}{\textbullet}",
    "info": r"\textcolor{info}{\textbullet}",
}


def level_mark(level: str) -> TexSafe:
    return TexSafe(LEVEL_TEX.get(level, r"\textbullet"))


def render(report, outdir: Path, figures: list) -> Path:
    """Write outdir/report.tex; figures are already in outdir/figures as PDF."""
    tex = (
        environment()
        .get_template("report.tex.j2")
        .render(
            report=report,
            # the comparison figures sit with the comparison tables; "Figures" holds the rest and
            # is left out when there is no rest (a heading over nothing)
            compare_figures=[_fig(f, outdir) for f in figures if f.id.startswith("compare")],
            figures=[_fig(f, outdir) for f in figures if not f.id.startswith("compare")],
            multi=len(report.runs) > 1,
        )
    )
    out = outdir / "report.tex"
    out.write_text(tex, encoding="utf-8")
    return out


def _fig(f, outdir: Path) -> dict:
    return {"title": f.title, "caption": f.caption, "path": TexSafe(_fig_path(f.path, outdir))}


def _fig_path(path: Path, outdir: Path) -> str:
    rel = path.relative_to(outdir).as_posix()
    if not all(c.isalnum() or c in "-_./" for c in rel):  # plots name files with _safe(); belt and braces
        raise GpuboxError(f"figure file name {rel!r} is not safe for LaTeX", "rename the run (--name)")
    return rel


INSTALL_HINT = (
    "apt-get install texlive-latex-base texlive-latex-recommended texlive-fonts-recommended latexmk"
)


def compile_pdf(tex: Path, timeout: float = 180.0) -> Path:
    """latexmk when installed, else pdflatex twice (longtable needs a second pass for widths)."""
    cwd = tex.parent
    if shutil.which("latexmk"):
        runs = [
            ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", tex.name]
        ]
    elif shutil.which("pdflatex"):
        one = ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error", tex.name]
        runs = [one, one]
    else:
        raise GpuboxError(
            "--pdf needs latexmk or pdflatex, and neither is installed",
            f"{INSTALL_HINT}, or leave out --pdf and compile {tex} yourself",
        )
    for argv in runs:
        try:
            p = subprocess.run(
                argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise GpuboxError(
                f"{argv[0]} took longer than {timeout:.0f} s on {tex}", f"see {tex.with_suffix('.log')}"
            ) from None
        if p.returncode != 0:
            raise GpuboxError(
                f"{argv[0]} failed on {tex}: {_first_error(tex.with_suffix('.log'), p.stdout)}",
                f"see {tex.with_suffix('.log')}",
            )
    pdf = tex.with_suffix(".pdf")
    if not pdf.exists():
        raise GpuboxError(f"{runs[0][0]} made no {pdf.name}", f"see {tex.with_suffix('.log')}")
    return pdf


def _first_error(log: Path, stdout: str) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = stdout
    for line in text.splitlines():
        if line.startswith("!") or ":error:" in line.replace(" ", "") or ".tex:" in line and "Error" in line:
            return line.strip()[:200]
    return "see the log"
