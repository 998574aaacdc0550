"""`gpubox demo`: a simulated box with the seed's reboot faults, recovered end to end (the only
provision command that imports the simulator, inside the function that builds the box)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import click
from rich.markup import escape

from gpubox.clihelp import json_option
from gpubox.output import console, print_json, render_report


@click.command()
@click.option(
    "--keep", "keep", type=click.Path(file_okay=False), help="Build the simulated box here and keep it."
)
@click.option("--fault", "faults", multiple=True, help="Faults to reproduce (default: all of the seed's).")
@click.option("--no-bench", is_flag=True)
@json_option
@click.pass_context
def demo(ctx: click.Context, keep, faults, no_bench, as_json) -> None:
    """Build a simulated box with the seed's reboot faults and recover it end to end."""
    from gpubox.simbox import DEMO_FAULTS, all_faults, check_faults

    chosen = list(faults) or [f for f in DEMO_FAULTS if f in all_faults()]
    check_faults(chosen)  # a bad --fault is refused before any directory is made
    dest = keep or tempfile.mkdtemp(prefix="gpubox-demo-")
    try:
        rc = _run(dest, chosen, keep, no_bench, as_json)
    finally:
        if not keep:  # the temporary box goes with the run; --keep is the way to keep it
            shutil.rmtree(dest, ignore_errors=True)
    sys.exit(rc)


def _run(dest: str, chosen: list[str], keep, no_bench: bool, as_json: bool) -> int:
    """Build, doctor, recover, doctor again; the exit status (0 when the box ends healthy)."""
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.simbox import build

    from ..recover import doctor as run_doctor
    from ..recover import recover as run_recover
    from ..recover import render_outcome

    con = console(stderr=as_json)
    t0 = time.monotonic()
    sim = build(dest, chosen)
    # The demo keeps its state (backups, history, results) inside its own directory.
    os.environ["GPUBOX_STATE_DIR"] = str(sim.dest / "state")
    con.print(f"[bold]simulated box[/] in {sim.dest} with faults: {', '.join(sorted(chosen))}")
    from gpubox.simbox import lxcreal

    con.print(f"container: {lxcreal.runtime().describe()}", markup=False)  # real LXC where it can run
    inv = Inventory(sim.inventory_path)
    box = inv.box(sim.box)
    c = Context(
        box=box,
        inventory=inv,
        console=None if as_json else con,
        options={"yes": True, "restart": "auto", "persist": True},
    )
    try:
        before = run_doctor(Context(box=box, inventory=inv, options={"persist": True}))
        if not as_json:
            render_report(before, con, title=f"before: gpubox doctor {sim.box}", show_changes=False)
            con.print(f"[bold]gpubox recover {sim.box} --yes[/]")
        outcome = run_recover(c, bench=not no_bench, out_dir=str(sim.dest / "results"))
        after = run_doctor(Context(box=box, inventory=inv, options={"persist": True}))
    finally:
        c.close()
    secs = time.monotonic() - t0
    # The demo's box is healthy now, so a dry run on it has nothing to show: with --keep, a second
    # box with the same faults stays beside it to practise on (recover --dry-run, then recover).
    practice = build(str(sim.dest / "practice"), chosen) if keep else None
    if as_json:
        doc = outcome.to_dict()
        doc.update(
            {
                "demo_dir": str(sim.dest),
                "kept": bool(keep),  # false: the directory is removed when the demo ends
                "inventory": str(sim.inventory_path),
                "doctor_before_ok": before.ok,
                "doctor_after_ok": after.ok,
                "demo_seconds": round(secs, 2),
                "practice_inventory": str(practice.inventory_path) if practice else None,
            }
        )
        print_json(doc)
    else:
        render_outcome(outcome, f"gpubox recover {sim.box}")
        render_report(after, con, title=f"after: gpubox doctor {sim.box}", show_changes=False)
        con.print(
            f"demo took {secs:.1f} s; "
            + (
                f"inventory: {sim.inventory_path}"
                if keep
                else "the box was temporary and is removed (--keep DIR keeps it)"
            )
        )
        for line in practice_lines(practice, chosen):
            con.print(line)
    return 0 if (outcome.exit_code == 0 and after.ok) else 1


def practice_lines(practice, faults) -> list[str]:
    """What to type next: the kept faulty box's commands, or the command that makes one."""
    import shlex

    if practice is None:
        cmd = "gpubox sim create /tmp/gpubox-practice" + "".join(f" --fault {shlex.quote(f)}" for f in faults)
        return [
            "a faulty box to practise on: "
            + escape(cmd)
            + " && gpubox -i /tmp/gpubox-practice/inventory.yml recover ct200 --dry-run"
        ]
    inv = shlex.quote(str(practice.inventory_path))
    return [
        f"a box with the same faults to practise on: {escape(str(practice.dest))}",
        f"  gpubox -i {escape(inv)} doctor {practice.box}",
        f"  gpubox -i {escape(inv)} recover {practice.box} --dry-run",
        f"  gpubox -i {escape(inv)} recover {practice.box}",
    ]
