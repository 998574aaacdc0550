"""`gpubox report RESULT.json... [--format latex|md|html] [--pdf] [-o DIR] [--compare]`."""

from __future__ import annotations

import click

from gpubox.clihelp import json_option


@click.command("report")
@click.argument("results", nargs=-1, required=True, metavar="RESULT.json...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["latex", "md", "html"]),
    default="latex",
    show_default=True,
    help="LaTeX (with PDF figures), Markdown (PNG figures) or one self-contained HTML file.",
)
@click.option("--pdf", is_flag=True, help="Compile the LaTeX with latexmk/pdflatex (LaTeX format only).")
@click.option(
    "-o",
    "--out",
    "outdir",
    default="report",
    show_default=True,
    type=click.Path(),
    help="Directory for the report and its figures/.",
)
@click.option(
    "--compare",
    is_flag=True,
    help="Compare each run with the first (e.g. before/after tuning): "
    "side-by-side table with deltas, a delta plot and a finding.",
)
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="NAME",
    help="What to call each run, in order (default: the file name without .json).",
)
@click.option("--title", default=None, help="Report title (default: the box names).")
@json_option
def report(
    results: tuple[str, ...],
    fmt: str,
    pdf: bool,
    outdir: str,
    compare: bool,
    names: tuple[str, ...],
    title: str | None,
    as_json: bool,
) -> None:
    """Write a report from one or more benchmark result files: findings with their numbers first,
    then tables (TP scaling, method x output length, concurrency, long context, acceptance length),
    plots, the health verdict and the box facts.

    \b
    Examples:
      gpubox report results/ct200-20261129T101500Z.json --format html -o /tmp/r
      gpubox report before.json after.json --compare --pdf -o report
    """
    from gpubox.output import console, print_json

    from ..report import make_report

    out = make_report(results, fmt=fmt, outdir=outdir, pdf=pdf, compare=compare, names=names, title=title)
    if as_json:
        print_json(out.to_dict())
        return
    from rich.markup import escape

    con = console()
    mark = {"good": "[green]+[/]", "warn": "[red]![/]", "info": "[blue]-[/]"}
    for f in out.report.findings:
        who = f"[dim]{escape(f.run)}:[/] " if f.run and len(out.report.runs) > 1 else ""
        con.print(f"{mark.get(f.level, '-')} {who}{escape(f.text)}")
    if not out.report.findings:
        con.print("[dim]no findings: too few successful measurements[/]")
    con.print(f"wrote {escape(str(out.pdf or out.main))} ({len(out.files)} files in {escape(outdir)})")
