"""`gpubox doctor`, `gpubox recover` and `gpubox demo`."""

from __future__ import annotations

import os
import sys
import tempfile
import time

import click
from rich.markup import escape

from gpubox.clihelp import ask, box_context, json_option
from gpubox.output import console, print_json, render_report

skip_option = click.option(
    "--skip", multiple=True, metavar="STEP", help="Skip a step or group (repeat or comma-separate)."
)
only_option = click.option("--only", multiple=True, metavar="STEP", help="Run only these steps or groups.")


@click.command()
@click.argument("box")
@skip_option
@only_option
@click.option(
    "--persist/--no-persist",
    default=True,
    show_default=True,
    help="Also check that host repairs survive the next reboot (as recover makes them).",
)
@json_option
@click.pass_context
def doctor(ctx: click.Context, box: str, skip, only, persist: bool, as_json: bool) -> None:
    """Check everything on BOX, read-only: one table with the cause and repair of each problem."""
    from .recover import doctor as run_doctor

    c = box_context(ctx, box, as_json=as_json, persist=persist)
    try:
        report = run_doctor(c, skip, only)
        from .cli_autostart import reboot_safe

        safe, why = reboot_safe(c)  # a summary, not a step: a box without autostart is not unhealthy
    finally:
        c.close()
    if as_json:
        print_json(dict(report.to_dict(), reboot_safe={"ok": safe, "detail": why}))
    else:
        render_report(report, console(), title=f"gpubox doctor {box}", show_changes=False)
        console().print(
            f"reboot-safe: {escape(why)}" + ("" if safe else f" (gpubox autostart install {escape(box)})")
        )
    sys.exit(report.exit_code)


@click.command()
@click.argument("box")
@click.option(
    "--dry-run", is_flag=True, help="Check and plan every step; print every diff and command; change nothing."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask before restarting the container.")
@skip_option
@only_option
@click.option("--no-bench", is_flag=True, help="Repair only; skip the verification benchmark.")
@click.option("--profile", default=None, help="Benchmark profile (default: the box's, else health).")
@click.option("--restart", type=click.Choice(["auto", "never", "always"]), default="auto", show_default=True)
@click.option(
    "--persist/--no-persist",
    default=True,
    show_default=True,
    help="Also make host repairs survive the next reboot (modules-load, udev, sysctl.d, oneshot unit).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Where results and the report go.")
@click.option(
    "--format", "report_format", type=click.Choice(["md", "html", "latex"]), default="md", show_default=True
)
@json_option
@click.pass_context
def recover(
    ctx: click.Context,
    box: str,
    dry_run,
    yes,
    skip,
    only,
    no_bench,
    profile,
    restart,
    persist,
    out_dir,
    report_format,
    as_json,
) -> None:
    """Diagnose and repair BOX after a reboot, then prove it with the verification benchmark."""
    from .recover import recover as run_recover

    confirm = None
    if not yes and not dry_run and sys.stdin.isatty():

        def confirm(question: str) -> bool:  # the container restart asks first unless --yes
            return ask(question)

    c = box_context(
        ctx,
        box,
        as_json=as_json,
        dry_run=dry_run,
        yes=yes,
        restart=restart,
        persist=persist,
        bench_profile=profile,
        confirm=confirm,
    )
    try:
        outcome = run_recover(
            c,
            dry_run=dry_run,
            skip=skip,
            only=only,
            bench=not no_bench,
            profile=profile,
            out_dir=out_dir,
            report_format=report_format,
        )
    finally:
        c.close()
    if as_json:
        print_json(outcome.to_dict())
    else:
        _summary(outcome, f"gpubox recover {box}" + (" --dry-run" if dry_run else ""))
    sys.exit(outcome.exit_code)


def _summary(outcome, title: str) -> None:
    con = console()
    render_report(outcome.report, con, title=title)
    for n in outcome.notes:
        con.print(f"[yellow]note:[/] {escape(n)}")
    if outcome.bench is not None:
        v = outcome.bench.get("verdict", {})
        colour = {"healthy": "green", "degraded": "yellow"}.get(v.get("status"), "red")
        con.print(f"benchmark verdict: [{colour}]{v.get('status')}[/]")
        for r in v.get("reasons", []):
            con.print(f"  - {escape(r.get('message', ''))}")
        con.print(f"results: {outcome.bench_path}")
        if outcome.report_path:
            con.print(f"report:  {outcome.report_path}")


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
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.simbox import DEMO_FAULTS, all_faults, build

    from .recover import doctor as run_doctor
    from .recover import recover as run_recover

    dest = keep or tempfile.mkdtemp(prefix="gpubox-demo-")
    chosen = list(faults) or [f for f in DEMO_FAULTS if f in all_faults()]
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
                "inventory": str(sim.inventory_path),
                "doctor_before_ok": before.ok,
                "doctor_after_ok": after.ok,
                "demo_seconds": round(secs, 2),
                "practice_inventory": str(practice.inventory_path) if practice else None,
            }
        )
        print_json(doc)
    else:
        _summary(outcome, f"gpubox recover {sim.box}")
        render_report(after, con, title=f"after: gpubox doctor {sim.box}", show_changes=False)
        con.print(
            f"demo took {secs:.1f} s; inventory: {sim.inventory_path}"
            + ("" if keep else " (temporary: use --keep DIR to keep it)")
        )
        for line in practice_lines(practice, chosen):
            con.print(line)
    sys.exit(0 if (outcome.exit_code == 0 and after.ok) else 1)


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
