"""`gpubox history BOX [--last N] [--plot FILE] [--json]`: tok/s per TP and method over time."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from gpubox.clihelp import json_option
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json


def _series_key(key: str) -> tuple:
    """Sort keys by TP number, then the rest: tp1/auto..., tp1/ddtree..., tp4/..."""
    m = re.match(r"tp(\d+)/(.*)", key)
    return (int(m.group(1)), m.group(2)) if m else (10**6, key)


def table_data(docs: list[dict[str, Any]], workload: str | None) -> tuple[list[str], list[dict[str, Any]]]:
    """(column keys, one row per run) for the measurements of WORKLOAD (None: all)."""
    from ..history import headline_field

    keys: set[str] = set()
    rows = []
    for d in docs:
        values = {}
        for m in d.get("measurements") or []:
            if not m.get("key") or (workload and m.get("workload") != workload):
                continue
            keys.add(m["key"])
            v = m.get(headline_field(m)) if m.get("status", "ok") == "ok" else None
            values[m["key"]] = v
        v = d.get("verdict") or {}
        rows.append(
            {
                "run_id": d.get("run_id"),
                "started_at": d.get("started_at"),
                "profile": d.get("profile"),
                "simulated": bool(d.get("simulated")),
                "status": v.get("status"),
                "flagged": sorted({r.get("key") for r in v.get("reasons") or [] if r.get("key")}),
                "values": values,
            }
        )
    return sorted(keys, key=_series_key), rows


def _label(key: str) -> str:
    """tp8/ddtree:15/decode/out1024 -> 'TP8 ddtree:15' (+ the workload when not plain decode)."""
    parts = key.split("/")
    head = f"{parts[0].upper()} {parts[1]}" if len(parts) > 1 else key
    tail = "/".join(parts[2:])
    return head if tail in ("decode/out1024", "") else f"{head} {tail}"


def plot(keys: list[str], rows: list[dict[str, Any]], path: str, box: str) -> None:
    """One line per TP/method; runs the verdict flagged for that line are marked with a red x."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on a server
    from datetime import datetime

    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from gpubox.escape import mathtext

    times = [datetime.strptime(r["started_at"], "%Y-%m-%dT%H:%M:%SZ") for r in rows]
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    for key in keys:
        pts = [(t, r["values"].get(key)) for t, r in zip(times, rows) if r["values"].get(key) is not None]
        if not pts:
            continue
        (line,) = ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=mathtext(_label(key))
        )
        bad = [
            (t, r["values"][key])
            for t, r in zip(times, rows)
            if key in r["flagged"] and r["values"].get(key) is not None
        ]
        if bad:
            ax.scatter([b[0] for b in bad], [b[1] for b in bad], marker="x", s=70, color="red", zorder=3)
    ax.set_title(mathtext(f"{box}: tokens/s per TP and method (x = flagged by the verdict)"))
    ax.set_ylabel("tok/s")
    ax.set_yscale("log")  # auto (~30 tok/s) and speculative (~300) on one chart
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.autofmt_xdate()
    fig.tight_layout()
    import io

    from gpubox.safeio import write_atomic

    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)  # rendered in memory, then one new file renamed into place
        write_atomic(path, buf.getvalue())
    except (OSError, ValueError) as exc:
        raise GpuboxError(
            f"cannot write plot {path}: {exc}", "give a writable .png, .svg or .pdf path"
        ) from None
    finally:
        plt.close(fig)


def _history_key(ctx, box: str):
    """BOX's identity from the inventory (Proxmox host + vmid) when it names the box and that
    history exists; else the name (a server measured by URL, runs recorded before identities).
    Never both: `history ct200` shows one box's runs."""
    from gpubox.errors import InventoryError

    from .. import history as store

    try:
        entry = ctx.find_root().obj.inventory.box(box)
    except (InventoryError, AttributeError):
        return box
    return entry if store.store_path(entry).exists() or not store.store_path(box).exists() else box


@click.command()
@click.argument("box")
@click.option("--last", type=click.IntRange(1, None), metavar="N", help="Only the newest N runs.")
@click.option(
    "--workload",
    default="decode",
    show_default=True,
    help="Which measurements to show (decode, concurrency, long_context, agentic, all).",
)
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Also draw a chart (.png/.svg/.pdf).",
)
@click.option(
    "--on-box",
    is_flag=True,
    help="Read the history the scheduled runs keep on the box (needs the inventory).",
)
@json_option
@click.pass_context
def history(ctx, box, last, workload, plot_file, on_box, as_json) -> None:
    """Show BOX's recorded benchmark runs: tok/s per TP and method over time, with each verdict."""
    from .. import history as store

    failed_unit = None  # --on-box: the scheduled check's service, when its last run failed
    if on_box:
        from gpubox.clihelp import box_context

        from ..schedule import failed_service, spec_from

        c = box_context(ctx, box, as_json=True)
        try:
            spec = spec_from(c.box)
            path = f"{spec.state_dir}/history/{store.store_key(c.box)}.jsonl"
            try:
                key = store.store_key(c.box)
                docs = [d for d in store.parse_lines(c.container.read_text(path)) if store.doc_key(d) == key]
            except FileNotFoundError:
                docs = []
            where = f"{box}:{path}"
            failed_unit = failed_service(c, spec)
        finally:
            c.close()
        docs = docs[-last:] if last else docs
    else:
        key = _history_key(ctx, box)
        skipped: list[str] = []
        docs = store.runs(key, last=last, problems=skipped)
        where = str(store.store_path(key))
        from gpubox.escape import terminal

        for p in skipped[:5]:  # damaged lines: said (on stderr), never listed as runs
            click.echo(f"gpubox: warning: skipped {terminal(p)}", err=True)
    if not docs and not failed_unit:
        others = [b for b in store.boxes() if b != box]
        hint = (
            f"boxes with a history here: {', '.join(others)}"
            if others and not on_box
            else f"run `gpubox bench {box}` or install a schedule (`gpubox schedule install {box}`)"
        )
        raise GpuboxError(f"no runs recorded for {box} in {where}", hint)
    keys, rows = table_data(docs, None if workload == "all" else workload)
    if plot_file:
        plot(keys, rows, plot_file, box)
    if as_json:
        doc = {"box": box, "store": where, "keys": keys, "runs": rows, "plot": plot_file}
        if on_box:
            doc["schedule_failing"] = bool(failed_unit)
        print_json(doc)
        sys.exit(1 if failed_unit else 0)
    t = Table(title=f"{box}: {len(rows)} run(s), {workload} tok/s ({escape(where)})")
    t.add_column("started (UTC)", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    for k in keys:
        t.add_column(escape(_label(k)).replace(" ", "\n", 1), justify="right")
    for r in rows:
        style = {"healthy": "green", "degraded": "yellow"}.get(r["status"], "bold red")
        cells = []
        for k in keys:
            v = r["values"].get(k)
            txt = "-" if v is None else f"{v:.1f}"
            cells.append(f"[red]{txt}[/]" if k in r["flagged"] else txt)
        when = (r["started_at"] or "?").replace("T", " ")[:16]
        t.add_row(when + (" [dim](sim)[/]" if r["simulated"] else ""), f"[{style}]{r['status']}[/]", *cells)
    con = console()
    con.print(t)
    if plot_file:
        con.print(f"plot: {escape(plot_file)}")
    if failed_unit:
        unit = escape(failed_unit)
        con.print(
            f"[bold red]the scheduled check's last run failed[/] (a degraded or failed verdict, or it "
            f"could not run; systemctl status {unit}; journalctl -u {unit})"
        )
    sys.exit(1 if failed_unit else 0)
