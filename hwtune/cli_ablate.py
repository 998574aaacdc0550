"""`gpubox tune ablate --local`: each NCCL variable of a profile on its own, repeated, with a 95% CI;
writes ablation.json, ablation.md (the table) and ablation.png (the plot) to --out."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from gpubox.clihelp import json_option, nccl_profile_option
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json


def table_md(result: dict) -> str:
    """The ablation as a Markdown table (docs quote it as is)."""
    lines = [
        f"Ablation of `{result['profile']}`: all-reduce busbw GB/s, mean ± 95% CI over "
        f"{result['repeats']} repeats; change against NCCL's defaults (`none`).",
        "",
        "| metric | arm | mean | ±CI | vs none | ±CI | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    f = lambda v, s="": "-" if v is None else f"{v:.2f}{s}"  # noqa: E731
    for r in result["rows"]:
        lines.append(
            f"| {r['metric']} | {r['arm']} | {f(r['mean'])} | {f(r['ci95'])} | {f(r['delta_pct'], '%')} "
            f"| {f(r['delta_ci95_pct'], '%')} | {r['significant'] or ''} |"
        )
    lines += ["", *(f"- {x}" for x in result.get("not_ablated", [])), f"- {result.get('host_settings')}"]
    return "\n".join(lines) + "\n"


@click.command("ablate")
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
    from . import ablate, nccl_compare
    from . import probe as probe_script
    from .cli_probe import _parse_sets
    from .nccl import load_profile
    from .topology import discover_local

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
    sets_arg = _parse_sets(allreduce_sets)
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
    write_text(out / "ablation.md", table_md(result))
    ablate.plot(result, str(out / "ablation.png"))
    if as_json:
        print_json(result)
    else:
        ablate.render(result, console())
        console().print(
            f"[dim]written: {out / 'ablation.json'}, {out / 'ablation.md'}, {out / 'ablation.png'}[/]"
        )
    sys.exit(1 if result["errors"] else 0)
