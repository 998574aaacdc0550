"""`gpubox tune ...`: check, pcie, numa, nccl and ablate, thin click front ends over the steps and
functions of hwtune (the playbooks call the same ones)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gpubox.clihelp import box_context, dry_run_option, emit, json_option, nccl_profile_option
from gpubox.clihelp import persist_option as persist_opt
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json
from gpubox.pipeline import run_steps

from .. import steps as hw_steps

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
    from .. import nccl_compare, nccl_gate
    from ..links import classify_topology
    from ..nccl import load_profile
    from ..topology import discover_local

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
    gate = nccl_gate.decide(result)
    if not as_json:
        nccl_gate.render(gate, console(stderr=True))
    return gate


@tune.command("ablate")
@click.option("--local", is_flag=True, help="Ablate on this machine (the only mode that measures GPUs).")
@nccl_profile_option(default="pcie-2numa", help_text="NCCL profile to take apart.")
@click.option(
    "--repeats",
    type=click.IntRange(2, 50),
    default=3,
    show_default=True,
    help="Runs per arm (rotated order); 2 or more for a confidence interval.",
)
@click.option("--sizes", default="1M,256M", show_default=True, help="All-reduce sizes.")
@click.option(
    "--allreduce-sets", metavar="SETS", help="GPU sets, e.g. '0,1' [default: the gpus_for_tp sets]."
)
@click.option("--no-leave-one-out", is_flag=True, help="Only '+VAR' arms, not 'all-VAR'.")
@click.option("--full", is_flag=True, help="Full-size probe iterations (default: quick).")
@click.option("--child-timeout", type=click.FloatRange(1, 3600), default=120.0, show_default=True)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="ablation",
    show_default=True,
    help="Directory for ablation.json, ablation.md and ablation.png.",
)
@json_option
def tune_ablate(
    local,
    nccl_profile,
    repeats,
    sizes,
    allreduce_sets,
    no_leave_one_out,
    full,
    child_timeout,
    out_dir,
    as_json,
):
    """Measure what each NCCL variable of PROFILE gives on its own (probe metrics).

    \b
    Arms: none (NCCL's defaults), +VAR (defaults plus that variable only), all-VAR, all. Every
    child keeps NVLink multicast off. MaxReadReq and NUMA balancing are host settings and are not
    toggled here; the table says so.
      gpubox tune ablate --local --nccl-profile pcie-2numa --repeats 3 --out ablation/
    """
    from .. import ablate, nccl_compare
    from .. import probe as probe_script
    from ..nccl import load_profile
    from ..topology import discover_local

    if not local:
        raise GpuboxError(
            "tune ablate measures GPUs on this machine only", "run it with --local where the GPUs are"
        )
    try:
        size_list = probe_script.parse_bytes(sizes)
    except (ValueError, IndexError):
        size_list = None
    if not size_list or min(size_list) < 4:
        raise GpuboxError(f"--sizes {sizes!r} is not a list of byte sizes", "e.g. 1M,256M")
    profile = load_profile(nccl_profile)
    sets_arg = nccl_compare.parse_gpu_sets(allreduce_sets)
    if sets_arg is not None:
        sets = [{"tp": len(s), "gpus": s} for s in sets_arg if len(s) > 1]
    else:
        sets = nccl_compare.tp_sets(discover_local())
    if not sets:
        raise GpuboxError(
            "no TP set of 2 or more GPUs on this machine: nothing to ablate",
            "run it on a machine with 2 or more GPUs",
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = ablate.run(
        profile,
        sets,
        sizes=size_list,
        repeats=repeats,
        quick=not full,
        python=sys.executable,
        base_env=dict(os.environ),
        timeout=child_timeout,
        leave_one_out=not no_leave_one_out,
    )
    from gpubox.safeio import write_text

    write_text(out / "ablation.json", json.dumps(result, indent=1) + "\n")
    write_text(out / "ablation.md", ablate.table_md(result))
    ablate.plot(result, str(out / "ablation.png"))
    if as_json:
        print_json(result)
    else:
        ablate.render(result, console())
        console().print(
            f"[dim]written: {out / 'ablation.json'}, {out / 'ablation.md'}, {out / 'ablation.png'}[/]"
        )
    sys.exit(1 if result["errors"] else 0)
