"""`gpubox tune ...`, `gpubox nccl ...` and `gpubox gpus BOX`: thin click front ends over the steps
and functions of hwtune (the playbooks call the same ones)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from gpubox.clihelp import box_context, dry_run_option, emit, json_option, nccl_profile_option
from gpubox.clihelp import persist_option as persist_opt
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json
from gpubox.pipeline import run_steps

from . import steps as hw_steps

persist_option = persist_opt("Also make it survive reboots (boot unit / sysctl.d).")


def _run(
    ctx: click.Context,
    box: str,
    names: tuple[str, ...],
    *,
    as_json: bool,
    mode: str | None = None,
    title: str,
    **options,
) -> None:
    # No checks of its own: --mrrs / gpubox_pcie_mrrs and gpubox_numa_balancing are the steps'
    # options (checked by the engine before anything is read: exit 2), an --include BDF the host
    # lacks is BadInput from the pcie facts (exit 2 before anything is written), the inventory is
    # checked by box_context (gpubox.invschema.check_box): the same one-line errors as recover.
    c = box_context(ctx, box, as_json=as_json, **options)
    mode = mode or ("plan" if options.get("dry_run") else "apply")
    try:
        report = run_steps(c, hw_steps(c, names), mode)
    finally:
        c.close()
    emit(report, as_json, title=title)


# -- gpubox tune ---------------------------------------------------------------------------------
@click.group()
def tune() -> None:
    """Host tuning: PCIe MaxReadReq, NUMA balancing, NCCL environment (check, dry-run, apply)."""


@tune.command("check")
@click.argument("box")
@persist_opt("Also check that the settings are persisted for the next boot.")
@json_option
@click.pass_context
def tune_check(ctx, box, persist, as_json):
    """Check every tuning of BOX; change nothing. Exit 1 when something needs doing."""
    _run(
        ctx,
        box,
        ("pcie-mrrs", "pcie-link", "numa-balancing", "nccl-env"),
        as_json=as_json,
        mode="check",
        title=f"{box}: tune check",
        persist=persist,
    )


@tune.command("pcie")
@click.argument("box")
@click.option(
    "--mrrs",
    metavar="BYTES",
    help="MaxReadReq target: 128..4096 (power of two) or code 0..5 [default: gpubox_pcie_mrrs or 4096].",
)
@click.option(
    "--include",
    "include",
    multiple=True,
    metavar="WHAT",
    help="Also tune 'audio' functions, 'bridge's, or a BDF (repeat). GPU functions only by default.",
)
@dry_run_option
@persist_option
@json_option
@click.pass_context
def tune_pcie(ctx, box, mrrs, include, dry_run, persist, as_json):
    """Set PCIe MaxReadReq on the GPU functions of BOX's host with a masked setpci write, read it
    back, and report link status. --dry-run shows each device's before/after and the exact argv."""
    _run(
        ctx,
        box,
        ("pcie-mrrs", "pcie-link"),
        as_json=as_json,
        title=f"{box}: tune pcie",
        mrrs=mrrs,
        include=include,
        dry_run=dry_run,
        persist=persist,
    )


@tune.command("numa")
@click.argument("box")
@dry_run_option
@persist_option
@json_option
@click.pass_context
def tune_numa(ctx, box, dry_run, persist, as_json):
    """Turn kernel.numa_balancing off on BOX's host (--persist: /etc/sysctl.d/90-gpubox-numa.conf)."""
    _run(
        ctx,
        box,
        ("numa-balancing",),
        as_json=as_json,
        title=f"{box}: tune numa",
        dry_run=dry_run,
        persist=persist,
    )


@tune.command("nccl")
@click.argument("box")
@nccl_profile_option(help_text="Profile name or YAML file [default: gpubox_nccl_profile].")
@dry_run_option
@json_option
@click.pass_context
@click.option(
    "--measure",
    "measure_gate",
    is_flag=True,
    help="Measure first (this machine's GPUs: A/B all-reduce with an A/A arm); "
    "install only if the profile is slower nowhere and faster somewhere.",
)
def tune_nccl(ctx, box, nccl_profile, dry_run, as_json, measure_gate):
    """Write the NCCL profile where BOX's server reads it (EnvironmentFile + /etc/nccl.conf)."""
    gate = _measure_gate(ctx, box, nccl_profile, as_json) if measure_gate else None
    _run(
        ctx,
        box,
        ("nccl-env",),
        as_json=as_json,
        title=f"{box}: tune nccl",
        nccl_profile=nccl_profile,
        dry_run=dry_run,
        nccl_gate=gate,
    )


def _measure_gate(ctx, box, profile, as_json) -> dict:
    """The A/B gate on this machine's GPUs (gpubox runs where the server's GPUs are, or a copy of
    the box's hardware): see hwtune/nccl_gate.py."""
    from . import nccl_compare, nccl_gate
    from .cli_probe import render_gate
    from .links import classify_topology
    from .nccl import load_profile
    from .topology import discover_local

    c = box_context(ctx, box, as_json=as_json)
    try:
        name = profile or c.box.var("gpubox_nccl_profile")
    finally:
        c.close()
    if not name:
        raise GpuboxError("no profile to measure", "give --nccl-profile or set gpubox_nccl_profile")
    prof = load_profile(str(name))
    topo = discover_local()
    result = nccl_compare.run(prof, nccl_compare.tp_sets(topo), rounds=2, quick=True, aa=True, timeout=120.0)
    result["topology_class"] = classify_topology(topo)
    result["profile_topologies"] = list(prof.topologies)
    gate = nccl_gate.judge(result)
    if not as_json:
        render_gate(gate, console(stderr=True))
    return gate


from .cli_ablate import tune_ablate  # noqa: E402

tune.add_command(tune_ablate)


# -- gpubox nccl ---------------------------------------------------------------------------------
@click.group()
def nccl() -> None:
    """NCCL environment profiles: list, show, export, check."""


def _issue_lines(issues) -> list[str]:
    return [f"{i.level}: {i}" for i in issues]


@nccl.command("profiles")
@json_option
def nccl_profiles(as_json):
    """List the profiles (shipped, ~/.config/gpubox/nccl-profiles, $GPUBOX_NCCL_PROFILES)."""
    from .nccl import list_profiles

    profiles = list_profiles()
    if as_json:
        print_json({n: p.to_dict() for n, p in sorted(profiles.items())})
        return
    t = Table(title="NCCL profiles")
    for col in ("name", "variables", "warnings", "description"):
        t.add_column(col, overflow="fold")
    for n, p in sorted(profiles.items()):
        t.add_row(
            n,
            escape(" ".join(f"{k}={v}" for k, v in p.env.items())),
            str(sum(i.level == "warning" for i in p.issues)),
            escape(p.description),
        )
    console().print(t)


@nccl.command("show")
@click.argument("name")
@json_option
def nccl_show(name, as_json):
    """Show one profile with its validation warnings."""
    from .nccl import load_profile

    p = load_profile(name)
    if as_json:
        print_json(p.to_dict())
        return
    con = console()
    con.print(f"[bold]{escape(p.name)}[/]  ({escape(p.path)})\n{escape(p.description)}")
    if p.notes:
        con.print(f"[dim]{escape(p.notes)}[/]")
    for k, v in p.env.items():
        con.print(f"  {k}={escape(v)}")
    for line in _issue_lines(p.issues):
        con.print(f"  [yellow]{escape(line)}[/]")


@nccl.command("export")
@nccl_profile_option(help_text="Profile name or YAML file [default: pcie-2numa].")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["shell", "envfile", "docker", "ncclconf", "json"]),
    default="shell",
    show_default=True,
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="Write to FILE (atomically) instead of stdout."
)
def nccl_export(nccl_profile, fmt, output):
    """Export a profile: shell `export K=V`, systemd EnvironmentFile, docker --env-file, nccl.conf, JSON."""
    from .nccl import load_profile, render

    p = load_profile(nccl_profile or "pcie-2numa")
    header = None if fmt == "json" else f"NCCL profile {p.name}, exported by gpubox ({fmt})"
    text = render(p.env, fmt, header=header)
    for line in _issue_lines(p.issues):
        click.echo(f"gpubox: {line}", err=True)
    if not output:
        sys.stdout.write(text)
        return
    path = Path(output)
    tmp = path.with_name(f".{path.name}.gpubox.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@nccl.command("check")
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--env", "use_env", is_flag=True, help="Check the NCCL_* variables of the current environment.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "shell", "envfile", "docker", "ncclconf", "json"]),
    default="auto",
    show_default=True,
)
@json_option
def nccl_check(file, use_env, fmt, as_json):
    """Validate an env file (any export format) or the environment: unknown names with a
    did-you-mean, bad values, debug-class and deprecated names. Exit 1 on errors."""
    from .nccl import detect_format, errors, parse, validate

    if bool(file) == bool(use_env):
        raise GpuboxError("give exactly one of FILE or --env", "e.g. gpubox nccl check /etc/gpubox/nccl.env")
    unsafe = []
    if use_env:
        env, source, only_nccl = (
            {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
            "environment",
            True,
        )
    else:
        from gpubox.readlimit import read_text_file

        from .nccl import Issue, unsafe_lines

        text = read_text_file(file, what="NCCL env file")
        fmt = detect_format(text, file) if fmt == "auto" else fmt
        env, source, only_nccl = parse(text, fmt), f"{file} ({fmt})", fmt not in ("json",)
        env = {
            k: v for k, v in env.items() if not only_nccl or k.strip().startswith("NCCL_") or k != k.strip()
        }
        if fmt in ("shell", "envfile"):  # what `set -a; . FILE` would run or expand, not just assign
            unsafe = [
                Issue(
                    "error",
                    f"line {no}",
                    f"{line.strip()[:80]!r}: a shell sourcing this file "
                    "would not read a plain value (unquoted metacharacter); quote it as "
                    "`gpubox nccl export` does",
                )
                for no, line in unsafe_lines(text)
            ]
    issues = unsafe + validate(env, only_nccl=only_nccl)
    bad = errors(issues)
    if as_json:
        print_json(
            {
                "source": source,
                "ok": not bad,
                "env": env,
                "issues": [
                    {"level": i.level, "name": i.name, "message": i.message, "suggestion": i.suggestion}
                    for i in issues
                ],
            }
        )
    else:
        con = console()
        con.print(f"{escape(source)}: {len(env)} NCCL variable(s)")
        for i in issues:
            con.print(f"  [{'red' if i.level == 'error' else 'yellow'}]{i.level}[/]: {escape(str(i))}")
        con.print("[green]ok[/]" if not bad else f"[red]{len(bad)} error(s)[/]")
    sys.exit(1 if bad else 0)


# -- gpubox gpus ---------------------------------------------------------------------------------
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

    from .topology import discover, discover_local, from_file, gpus_for_tp

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
