"""Benchmark reports from result JSON (`gpubox.bench/1`): findings first, tables, plots, verdict,
box facts; as LaTeX (optionally compiled to PDF), Markdown, or one self-contained HTML file.

    from gpubox.bench.report import make_report
    out = make_report(["before.json", "after.json"], fmt="md", outdir="report", compare=True)

Heavy imports (matplotlib, jinja2) happen inside make_report so `gpubox --help` stays fast.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from gpubox.errors import GpuboxError

FORMATS = ("latex", "md", "html")


@dataclass
class Output:
    report: object  # model.Report
    files: list[Path] = field(default_factory=list)
    main: Path | None = None
    pdf: Path | None = None

    def to_dict(self) -> dict:
        d = self.report.to_dict()
        d.update(
            files=[str(f) for f in self.files],
            main=str(self.main) if self.main else None,
            pdf=str(self.pdf) if self.pdf else None,
        )
        return d


def make_report(
    paths: Iterable[str | Path],
    fmt: str = "latex",
    outdir: str | Path = "report",
    pdf: bool = False,
    compare: bool = False,
    names: Iterable[str] = (),
    title: str | None = None,
) -> Output:
    """Load the runs, then write the report and its figures into outdir."""
    from . import latex
    from .data import load_runs

    if fmt not in FORMATS:
        raise GpuboxError(f"unknown report format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    if pdf and fmt != "latex":
        raise GpuboxError(f"--pdf makes a PDF from LaTeX, not from {fmt}", "use --format latex with --pdf")
    if pdf and not (shutil.which("latexmk") or shutil.which("pdflatex")):  # before writing anything
        raise GpuboxError(
            "--pdf needs latexmk or pdflatex, and neither is installed",
            f"{latex.INSTALL_HINT}, or leave out --pdf",
        )
    runs = load_runs(paths, names)
    if compare and len(runs) < 2:
        raise GpuboxError(
            "--compare needs two or more result files", "give the baseline first, then the runs to compare"
        )
    out_dir = Path(outdir)
    if out_dir.exists() and not out_dir.is_dir():
        raise GpuboxError(f"{out_dir} exists and is not a directory", "choose another -o DIR")

    from gpubox.safeio import staged

    from . import markdown, model, plots
    from .advice import advise_all
    from .advice_io import server_logs

    advised = runs[1:] if compare else runs  # with --compare the first run is the baseline being replaced
    advice = advise_all(advised, logs={r.name: server_logs(r) for r in advised})
    rep = model.build(runs, compare=compare, title=title, advice=advice)
    # Written into a private directory inside out_dir and moved in by rename only when every file
    # is done (gpubox.safeio.staged): a planted symlink `out_dir/report.md` is replaced, not followed,
    # and a rendering or LaTeX error leaves nothing behind.
    with staged(out_dir) as work:
        figs = plots.make_all(runs, work / "figures", "pdf" if fmt == "latex" else "png", compare=compare)
        render = {"latex": latex.render, "md": markdown.render_markdown, "html": markdown.render_html}[fmt]
        main = render(rep, work, figs)
        files = [main] + ([] if fmt == "html" else [f.path for f in figs])
        pdf_path = latex.compile_pdf(main) if pdf else None
    final = lambda p: out_dir / Path(p).relative_to(work)  # noqa: E731
    res = Output(rep, [final(f) for f in files], final(main))
    if pdf_path:
        res.pdf = final(pdf_path)
        res.files.append(res.pdf)
    return res
