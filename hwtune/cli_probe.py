"""`gpubox probe`: GPU health in seconds — NVML facts, PCIe link, copy bandwidth — judged
against the box's limits (inventory `gpubox_probe`). Exit 0 healthy, 1 problems, 2 could not run."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import click

from gpubox.clihelp import box_context, json_option, state
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json, render_report

from . import probe as probe_script
from .probe_step import box_limits, run_remote, _int
from .probe_verdict import limits, parse, report


@click.command("probe")
@click.argument("box", required=False)
@click.option("--local", is_flag=True, help="Probe this machine directly (no inventory needed).")
@click.option("--input", "input_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Judge a probe JSON recorded earlier (hwtune/probe.py output) instead of probing.")
@click.option("--no-bandwidth", is_flag=True, help="NVML facts only; no torch copy probes.")
@click.option("--quick", is_flag=True, help="Smaller buffers and fewer repetitions.")
@click.option("--no-p2p", is_flag=True, help="Skip the GPU-pair copies.")
@json_option
@click.pass_context
def probe(ctx: click.Context, box: str | None, local: bool, input_path: str | None, no_bandwidth: bool,
          quick: bool, no_p2p: bool, as_json: bool) -> None:
    """Probe the GPUs of BOX's container (or this machine with --local).

    \b
    Reads per GPU through NVML: name, bus id, driver/CUDA versions, memory, persistence and MIG
    mode, PCIe link gen/width now and under load, ECC, remapped rows, clock event reasons, XIDs.
    With torch: pinned H2D/D2H bandwidth vs the link's rate, device memory bandwidth vs the GPU's
    spec, P2P per GPU pair and NCCL all-reduce busbw over the TP GPU sets.

    \b
      gpubox probe ct200               # in the container, through its transport
      gpubox probe ct200 --quick --json
      gpubox probe --local             # this machine
      gpubox probe --input run.json    # judge a recorded probe
    """
    if local and input_path:
        raise GpuboxError("--local and --input exclude each other", "probe now (--local) or judge a file (--input)")
    if not (box or local or input_path):
        raise GpuboxError("nothing to probe", "give a BOX, --local, or --input FILE")
    flags = dict(quick=quick, bandwidth=not no_bandwidth, p2p=not no_p2p)
    expect = None
    if box:
        gctx = box_context(ctx, box, as_json=as_json)
        lim = box_limits(gctx.box)
        expect = _int(gctx.box.var("gpubox_gpus"))
        name, host = gctx.box.name, gctx.box.container.name
    else:
        gctx, lim = None, limits()
        name = host = socket.gethostname() if local else Path(input_path).name
    if input_path:
        try:
            text = Path(input_path).read_text()
        except OSError as exc:
            raise GpuboxError(f"cannot read {input_path}: {exc.strerror}", "give the path of a probe JSON file") from None
        doc = parse(text, source=input_path)
    else:
        spin = None if as_json else console(stderr=True).status(f"probing {name}: NVML, PCIe link, copy bandwidth …")
        if spin:
            spin.start()
        try:
            if local:
                doc = probe_script.collect(allreduce_sets=lim["allreduce_sets"], **flags)
            else:
                doc = run_remote(gctx.container, lim, **flags)
        finally:
            if spin:
                spin.stop()
            if gctx:
                gctx.close()
        if state(ctx).verbose and not as_json:
            click.echo(json.dumps(doc, indent=1), err=True)
    rep = report(doc, lim, box=name, host=host, expect_gpus=expect if not local else None)
    if as_json:
        print_json(rep.to_dict())
    else:
        con = console()
        _gpu_table(con, rep.extra["gpus"])
        render_report(rep, con, show_changes=False, title=f"{name}: GPU probe")
    sys.exit(rep.exit_code)


def _gpu_table(con, rows) -> None:
    from rich.table import Table

    if not rows:
        return
    t = Table(title="GPUs")
    for col in ("gpu", "name", "bus id", "link now / max", "H2D GB/s", "D2H GB/s", "D2D TB/s"):
        t.add_column(col, justify="right" if "/s" in col else "left", no_wrap=col in ("bus id", "gpu"))

    def pct(v, ref, scale=1.0):
        if v is None:
            return "-"
        txt = f"{v / scale:.2f}" if scale != 1.0 else f"{v:.1f}"
        return f"{txt} ({100 * v / ref:.0f}%)" if ref else txt

    for r in rows:
        t.add_row(str(r["gpu"]), str(r["name"]), str(r["bus_id"]), r["link"],
                  pct(r.get("h2d_gbps"), r.get("link_gbps")), pct(r.get("d2h_gbps"), r.get("link_gbps")),
                  pct(r.get("d2d_gbps"), r.get("mem_spec_gbps"), 1000.0))
    con.print(t)
