"""`gpubox gpus [BOX]`: the GPU topology and TP placements (hwtune/topology.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from gpubox.clihelp import box_context, json_option
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json


@click.command("gpus")
@click.argument("box", required=False)
@click.option("--local", is_flag=True, help="This machine's GPUs, through NVML here (no inventory needed).")
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Show a topology recorded earlier (nvml_probe.py or `gpubox gpus --json` output).",
)
@click.option(
    "--tp",
    "tps",
    multiple=True,
    type=int,
    help="TP size(s) to place [default: gpubox_bench.tp or 1, 4, 8; with --local/--input 1, 2, 4, 8].",
)
@json_option
@click.pass_context
def gpus(ctx, box, local, input_path, tps, as_json):
    """GPU topology of BOX (NVML, else sysfs, else the inventory hint) and TP placements.

    \b
      gpubox gpus ct200 --tp 4 --tp 8
      gpubox gpus --local --json > topology.json    # record this machine (a test fixture)
      gpubox gpus --input topology.json             # show a recorded one
    """
    import socket

    from ..topology import discover, discover_local, from_file, gpus_for_tp

    if sum(map(bool, (box, local, input_path))) != 1:
        raise GpuboxError(
            "give exactly one of BOX, --local or --input FILE",
            "e.g. gpubox gpus ct200, gpubox gpus --local, gpubox gpus --input topology.json",
        )
    if box:
        c = box_context(ctx, box, as_json=as_json)
        try:
            topo = discover(c)
        finally:
            c.close()
        if not tps:
            bench = c.box.var("gpubox_bench") or {}
            tps = tuple(bench.get("tp") or (1, 4, 8)) if isinstance(bench, dict) else (1, 4, 8)
    else:
        topo = discover_local() if local else from_file(input_path)
        box = socket.gethostname() if local else Path(input_path).name
        tps = tps or (1, 2, 4, 8)
    choices = [gpus_for_tp(topo, n) for n in tps]
    links = {
        "nvlink": sorted(k for k, p in topo.pairs.items() if (p.get("nvlinks") or 0) > 0),
        "pcie": sorted(k for k, p in topo.pairs.items() if not (p.get("nvlinks") or 0)),
    }
    if as_json:
        print_json({"box": box, **topo.to_dict(), "links": links, "tp": [ch.to_dict() for ch in choices]})
        sys.exit(0 if topo.gpus else 1)
    con = console()
    t = Table(title=f"{box}: GPUs ({topo.source})")
    for col in ("gpu", "bus id", "name", "NUMA", "link", "memory"):
        t.add_column(col)
    for g in topo.gpus:
        t.add_row(
            str(g.index),
            g.bus_id or "?",
            escape(g.name or "?"),
            "?" if g.numa_node is None else str(g.numa_node),
            g.link,
            f"{g.memory_mib} MiB" if g.memory_mib else "?",
        )
    con.print(t)
    if len(topo.gpus) > 1 and topo.pairs:
        m = Table(title="pairs (NV# = NVLinks; PIX/PXB/PHB/NODE/SYS as nvidia-smi topo -m)")
        m.add_column("")
        for g in topo.gpus:
            m.add_column(f"GPU{g.index}", justify="center")
        for a in topo.gpus:
            row = []
            for b in topo.gpus:
                if a.index == b.index:
                    row.append("X")
                    continue
                rel = topo.relation(a.index, b.index)
                row.append(
                    rel.get("relation", "?")
                    if rel.get("relation") != "PCIe"
                    else (rel.get("level") or "PCIe")
                )
            m.add_row(f"GPU{a.index}", *row)
        con.print(m)
        con.print(f"pairs: {len(links['nvlink'])} NVLink, {len(links['pcie'])} PCIe only")
    for ch in choices:
        style = "green" if ch.fits and not ch.crosses_numa else ("yellow" if ch.fits else "red")
        gp = ",".join(map(str, ch.gpus)) or "-"
        con.print(f"TP{ch.tp}: [{style}]{gp}[/]  {escape(ch.reason)}")
    for n in topo.notes:
        con.print(f"[dim]{escape(n)}[/]")
    sys.exit(0 if topo.gpus else 1)
