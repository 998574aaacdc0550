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
from gpubox.readlimit import read_regular

from .. import probe as probe_script
from ..gpu_probe_step import _int, box_limits, run_remote
from ..probe_verdict import limits, parse, report


@click.command("probe")
@click.argument("box", required=False)
@click.option("--local", is_flag=True, help="Probe this machine directly (no inventory needed).")
@click.option(
    "--input",
    "input_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Judge a probe JSON recorded earlier (hwtune/probe.py output) instead of probing.",
)
@click.option("--no-bandwidth", is_flag=True, help="NVML facts only; no torch copy probes.")
@click.option("--quick", is_flag=True, help="Smaller buffers and fewer repetitions.")
@click.option("--no-p2p", is_flag=True, help="Skip the GPU-pair copies.")
@click.option(
    "--p2p-pairs",
    metavar="PAIRS",
    help="GPU pairs to copy between, e.g. 0-1,0-4 [default: every ordered pair].",
)
@click.option(
    "--allreduce-sets",
    metavar="SETS",
    help="GPU sets for the all-reduce, e.g. '0,1,2,3;4,5,6,7' [default: gpubox_probe.allreduce_sets, "
    "else the TP sets].",
)
@click.option(
    "--nccl-compare",
    "compare_profile",
    metavar="PROFILE",
    help="With --local: all-reduce busbw over the gpus_for_tp sets, current environment vs + PROFILE, "
    "in separate child processes, side by side (NVLink multicast kept off in both).",
)
@click.option(
    "--rounds",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    help="With --nccl-compare: alternate the two arms this many times; medians are compared.",
)
@click.option("--sizes", metavar="SIZES", help="With --nccl-compare: all-reduce sizes [default: 1M,256M].")
@click.option(
    "--aa/--no-aa",
    default=True,
    show_default=True,
    help="With --nccl-compare: also run the baseline twice (A/A) for the gate's noise floor.",
)
@click.option(
    "--child-timeout",
    type=click.FloatRange(1, 3600),
    default=300.0,
    show_default=True,
    help="With --nccl-compare: seconds one child (one arm of one round) may run.",
)
@json_option
@click.pass_context
def probe(
    ctx: click.Context,
    box: str | None,
    local: bool,
    input_path: str | None,
    no_bandwidth: bool,
    quick: bool,
    no_p2p: bool,
    p2p_pairs: str | None,
    allreduce_sets: str | None,
    compare_profile: str | None,
    rounds: int,
    sizes: str | None,
    aa: bool,
    child_timeout: float,
    as_json: bool,
) -> None:
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
      gpubox probe --local --nccl-compare pcie-2numa --rounds 2   # + A/B gate verdict
      gpubox probe --input nccl_compare.json                      # the gate on a recorded comparison
    """
    if local and input_path:
        raise GpuboxError(
            "--local and --input exclude each other", "probe now (--local) or judge a file (--input)"
        )
    if not (box or local or input_path):
        raise GpuboxError("nothing to probe", "give a BOX, --local, or --input FILE")
    from ..nccl_compare import parse_gpu_sets

    sets_arg, pairs_arg = parse_gpu_sets(allreduce_sets), _parse_pairs(p2p_pairs)
    if compare_profile or sizes:
        if not local or not compare_profile:
            raise GpuboxError(
                "--nccl-compare (and --sizes) run on this machine only",
                "use: gpubox probe --local --nccl-compare PROFILE",
            )
        _compare(
            compare_profile,
            sets_arg,
            rounds=rounds,
            quick=quick,
            sizes=sizes,
            as_json=as_json,
            timeout=child_timeout,
            aa=aa,
        )
        return
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
            text = read_regular(input_path, 64 << 20, what="probe file").decode()
        except UnicodeDecodeError:
            raise GpuboxError(
                f"{input_path} is not UTF-8 text", "give the path of a probe JSON file"
            ) from None
        except OSError as exc:
            raise GpuboxError(
                f"cannot read {input_path}: {exc.strerror}", "give the path of a probe JSON file"
            ) from None
        if _is_compare(text):
            _gate_file(text, input_path, as_json)
            return
        doc = parse(text, source=input_path)
    else:
        spin = (
            None
            if as_json
            else console(stderr=True).status(f"probing {name}: NVML, PCIe link, copy bandwidth …")
        )
        if spin:
            spin.start()
        try:
            if local:
                doc = probe_script.collect(
                    allreduce_sets=sets_arg if sets_arg is not None else lim["allreduce_sets"],
                    p2p_pairs=pairs_arg,
                    **flags,
                )
            else:
                if sets_arg is not None:
                    lim["allreduce_sets"] = sets_arg
                doc = run_remote(gctx.container, lim, p2p_pairs=pairs_arg, **flags)
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
        _p2p_table(con, doc)
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
        t.add_row(
            str(r["gpu"]),
            str(r["name"]),
            str(r["bus_id"]),
            r["link"],
            pct(r.get("h2d_gbps"), r.get("link_gbps")),
            pct(r.get("d2h_gbps"), r.get("link_gbps")),
            pct(r.get("d2d_gbps"), r.get("mem_spec_gbps"), 1000.0),
        )
    con.print(t)


def _parse_pairs(text: str | None):
    if text is None:
        return None
    try:
        pairs = probe_script.parse_pairs(text)
    except ValueError:
        pairs = None
    if not pairs or any(a < 0 or b < 0 for a, b in pairs):
        raise GpuboxError(f"--p2p-pairs {text!r} is not a list of GPU pairs", "e.g. 0-1,0-4")
    return pairs


def _is_compare(text: str) -> bool:
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("schema") == "gpubox.nccl-compare/1"


def _gate_file(text: str, path: str, as_json: bool) -> None:
    """`--input` of a recorded comparison: the A/B gate's verdict, the same as at measuring time."""
    from .. import nccl_compare, nccl_gate

    doc = json.loads(text)
    gate = nccl_gate.decide(doc)
    if as_json:
        print_json(gate)
    else:
        con = console()
        nccl_compare.render(doc, con)
        nccl_gate.render(gate, con)
    sys.exit(0 if gate["verdict"] != nccl_gate.REFUSE else 1)


def _compare(
    profile_name: str,
    sets_arg,
    *,
    rounds: int,
    quick: bool,
    sizes: str | None,
    as_json: bool,
    timeout: float = 300.0,
    aa: bool = True,
) -> None:
    """`--local --nccl-compare PROFILE`: see hwtune/nccl_compare.py."""
    from .. import nccl_compare, nccl_gate
    from ..links import classify_topology
    from ..nccl import load_profile
    from ..topology import discover_local

    try:
        size_list = probe_script.parse_bytes(sizes) if sizes else None
    except (ValueError, IndexError):
        size_list = None
    if sizes and (not size_list or min(size_list) < 4):
        raise GpuboxError(f"--sizes {sizes!r} is not a list of byte sizes", "e.g. 1M,256M or 1048576")
    profile = load_profile(profile_name)
    topo = discover_local()
    if sets_arg is not None:
        sets = [
            {"tp": len(s), "gpus": s, "crosses_numa": None, "reason": "given with --allreduce-sets"}
            for s in sets_arg
            if len(s) > 1
        ]
        topo_note = "sets given with --allreduce-sets"
    else:
        sets = nccl_compare.tp_sets(topo)
        nodes = ", ".join(
            f"{'?' if k is None else k}: {','.join(map(str, v))}" for k, v in topo.nodes().items()
        )
        topo_note = (
            f"topology ({topo.source}): {len(topo.gpus)} GPU(s), NUMA nodes {nodes or '-'}; "
            + "; ".join(topo.notes)
        )
    con = None if as_json else console(stderr=True)
    spin = (
        con.status(f"all-reduce: current environment vs + {profile.name} ({rounds} round(s)) …")
        if con
        else None
    )
    if spin:
        spin.start()
    try:
        result = nccl_compare.run(
            profile, sets, sizes=size_list, rounds=rounds, quick=quick, timeout=timeout, aa=aa
        )
    finally:
        if spin:
            spin.stop()
    result["notes"].insert(0, topo_note)
    result["topology_class"] = classify_topology(topo)
    result["profile_topologies"] = list(profile.topologies)
    result["gate"] = nccl_gate.decide(result)
    if as_json:
        print_json(result)
    else:
        nccl_compare.render(result, console())
        nccl_gate.render(result["gate"], console())
    code = nccl_compare.exit_code(result)
    sys.exit(code if code else (1 if result["gate"]["verdict"] == nccl_gate.REFUSE else 0))


def _p2p_table(con, doc) -> None:
    """GPU-pair copy bandwidth as a matrix (rows: source, columns: destination)."""
    from rich.table import Table

    probes = [
        p
        for p in ((doc.get("bandwidth") or {}).get("probes") or [])
        if p.get("name") == "p2p" and p.get("src") != p.get("dst")
    ]
    if not probes:
        return
    idx = sorted({p["src"] for p in probes} | {p["dst"] for p in probes})
    cell = {(p["src"], p["dst"]): p for p in probes}
    t = Table(title="P2P copy GB/s (row -> column; * = no peer access)")
    t.add_column("src\\dst")
    for j in idx:
        t.add_column(f"GPU{j}", justify="right")
    for i in idx:
        row = []
        for j in idx:
            p = cell.get((i, j))
            if i == j or p is None:
                row.append("-")
            elif p.get("status") != "ok":
                row.append(str(p.get("status")))
            else:
                row.append(f"{p['gbps']:.1f}" + ("*" if p.get("peer_access") is False else ""))
        t.add_row(f"GPU{i}", *row)
    con.print(t)
