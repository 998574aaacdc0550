"""LaTeX rendering through a jinja2 template with LaTeX-safe delimiters, and PDF compilation.

Every value that reaches the template is escaped by `tex_escape` (the environment's finalize hook)
unless it is a `TexSafe` string built here from escaped parts, so a box name or server command
holding `_ % & # $ { } ~ ^ \\` prints as written instead of breaking the document.
"""

from __future__ import annotations

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
    """Plain text -> LaTeX source that typesets exactly that text."""
    if isinstance(value, TexSafe):
        return str(value)
    out = []
    for ch in str(value):
        if ch in _TEX:
            out.append(_TEX[ch])
        elif ch == "\n":
            out.append(" ")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append("?")
        elif ord(ch) < 128:
            out.append(ch)
        else:
            plain = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append(tex_escape(plain) if plain else "?")
    return "".join(out)


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


def colspec(table) -> TexSafe:
    """l for label columns, r for numbers; a wrapping column for long free text (reasons)."""
    spec = []
    for j, _ in enumerate(table.columns):
        col = [r[j] for r in table.rows if j < len(r)]
        if col and all(c.status == "label" for c in col):
            longest = max(len(c.text) for c in col)
            spec.append("p{0.5\\linewidth}" if longest > 60 else "l")
        elif (
            col
            and all(c.status in ("label", "failed", "skipped") for c in col)
            and j < len(table.columns) - 1
        ):
            spec.append("l")
        else:
            spec.append("r")
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
            figures=[
                {"title": f.title, "caption": f.caption, "path": TexSafe(_fig_path(f.path, outdir))}
                for f in figures
            ],
            multi=len(report.runs) > 1,
        )
    )
    out = outdir / "report.tex"
    out.write_text(tex, encoding="utf-8")
    return out


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
