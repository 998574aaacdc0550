"""`gpubox advise RESULT.json... [--probe PROBE.json] [--no-history] [--format text|md|html|latex] [-o FILE]`."""

from __future__ import annotations

import sys

import click

from gpubox.clihelp import json_option


@click.command("advise")
@click.argument("results", nargs=-1, required=True, metavar="RESULT.json...")
@click.option(
    "--probe",
    "probe_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PROBE.json",
    help="A `gpubox probe --json` document of the same box: its all-reduce figures become reasons.",
)
@click.option(
    "--history/--no-history",
    default=True,
    show_default=True,
    help="Use the box's earlier healthy runs (gpubox history) as a noise estimate.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "md", "html", "latex"]),
    default="text",
    show_default=True,
    help="text: tables on the terminal; md, html, latex: the advice as a document.",
)
@click.option(
    "-o",
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Write the md/html/latex document to FILE (default: standard output).",
)
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="NAME",
    help="What to call each run, in order (default: the file name without .json).",
)
@json_option
def advise(
    results: tuple[str, ...],
    probe_path: str | None,
    history: bool,
    fmt: str,
    out_file: str | None,
    names: tuple[str, ...],
    as_json: bool,
) -> None:
    """Turn benchmark results into a decision: for each workload (single request per output length,
    concurrency C, long context N tokens, agentic prompt) the best TP x method x budget, its margin
    over the runner-up and whether that margin is larger than the measured noise; the reasons; a
    serving plan (default and when to switch); and the runs that would decide what the data cannot.

    Exit status: 0 every row of the serving plan is beyond the noise and nothing the run tried
    failed; 1 some row is not (inside the noise, noise unknown, no plan at all) or a measurement
    failed, was skipped or was cut by the context window; 2 bad input.

    \b
    Examples:
      gpubox advise results/ct200-20261129T101500Z.json
      gpubox advise run.json --probe probe.json --format md -o advice.md
    """
    from gpubox.errors import GpuboxError
    from gpubox.output import print_json

    from ..report.advice import advise_all
    from ..report.advice_io import history_docs, load_probe, server_logs
    from ..report.data import load_runs

    if out_file and fmt == "text" and not as_json:
        raise GpuboxError(
            "-o writes a document, and --format text prints to the terminal", "add --format md, html or latex"
        )
    runs = load_runs(results, names)
    probe = load_probe(probe_path) if probe_path else None
    hist = {r.box: history_docs(r.box) for r in runs} if history else {}
    advices = advise_all(runs, hist, probe, {r.name: server_logs(r) for r in runs})
    rc = max(a.exit_code for a in advices)
    if as_json:
        print_json({"advice": [a.to_dict() for a in advices], "exit_code": rc})
        sys.exit(rc)
    if fmt == "text":
        _print(advices)
        sys.exit(rc)
    from ..report.advice_render import render

    boxes = ", ".join(dict.fromkeys(r.box for r in runs))
    text = render(advices, fmt, f"Advice: {boxes}")
    if out_file:
        _write(out_file, text)
    else:
        click.echo(text, nl=False)
    sys.exit(rc)


def _write(path: str, text: str) -> None:
    """Atomic: a temporary file beside the target, then a rename (never half a document)."""
    from pathlib import Path

    from gpubox.errors import GpuboxError
    from gpubox.safeio import write_text

    p = Path(path)
    try:
        write_text(p, text)  # gpubox.safeio: a new temp renamed in, a link at FILE replaced, not followed
    except GpuboxError as exc:
        raise GpuboxError(f"cannot write {p}: {exc.problem}", "choose a writable -o FILE") from None


def _print(advices: list) -> None:
    """Rich tables (they wrap, never cut); every string from the data goes in as Text, not markup."""
    from rich.table import Table
    from rich.text import Text

    from gpubox.output import console

    con = console()
    for a in advices:
        head = f"Advice for {a.run} (box {a.box})"
        con.print(Text(head, style="bold"))
        if a.simulated:
            con.print(Text("figures from gpubox's server simulator, not from GPUs", style="red"))
        if a.plan:
            t = Table(title="Serving plan", show_lines=True, expand=False)
            for c in ("when", "run", "evidence"):
                t.add_column(c, overflow="fold")
            for r in a.plan:
                run = Text(r.config.name, style="bold green" if r.decided else "bold yellow")
                if not r.decided:
                    run.append(" (not decided)", style="yellow")
                t.add_row(Text(r.when), run, Text(r.evidence))
            con.print(t)
        else:
            con.print(Text("no serving plan: no workload was measured successfully", style="red"))
        t = Table(title="By workload", show_lines=False)
        for c in ("workload", "best", "runner-up", "margin", "noise"):
            t.add_column(c, overflow="fold", justify="right" if c == "margin" else "left")
        for w in a.workloads:
            style = {"clear": "green", "within_noise": "yellow", "noise_unknown": "yellow"}.get(
                w.decision, "dim"
            )
            t.add_row(
                Text(w.title),
                Text(w.best_text),
                Text(w.runner_text),
                Text(w.margin_text),
                Text(w.noise_text, style=style),
            )
        con.print(t)
        for w in a.workloads:
            for reason in w.reasons:
                con.print(Text("- ", style="blue") + Text(f"{w.title}: {reason}"))
        for g in a.gaps:
            con.print(Text("! ", style="red") + Text(f"gap: {g.text}"))
        for n in a.notes:
            con.print(Text(f"note: {n}", style="yellow"))
        con.print(Text(f"noise rule: {a.rule}", style="dim"))
