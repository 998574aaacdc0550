"""`gpubox schedule install|status|remove|run-once BOX`: scheduled health checks."""

from __future__ import annotations

import sys

import click
from rich.markup import escape
from rich.table import Table

from gpubox.clihelp import box_context, emit, json_option
from gpubox.output import console, print_json
from gpubox.pipeline import run_steps

on_option = click.option(
    "--on",
    "on",
    type=click.Choice(["container", "host"]),
    default=None,
    help="Where the units live: in the container (default) or on the Proxmox host via pct exec.",
)
mech_option = click.option(
    "--mechanism",
    type=click.Choice(["auto", "systemd", "cron"]),
    default=None,
    help="auto: systemd when /run/systemd/system exists there, else /etc/cron.d.",
)


@click.group()
def schedule() -> None:
    """Run the health benchmark on a schedule: history, regressions, Prometheus, alerts."""


@schedule.command()
@click.argument("box")
@click.option("--every", metavar="SPAN", help="Interval, e.g. 6h, 30min, 1d (default 6h).")
@click.option("--on-calendar", metavar="SPEC", help='systemd calendar spec, e.g. "*-*-* 00/6:00:00".')
@click.option("--profile", default=None, help="Benchmark profile (default health).")
@click.option("--timeout", metavar="SPAN", help="Time limit of one run (default 2h).")
@on_option
@mech_option
@click.option(
    "--dry-run", is_flag=True, help="Print the unit files (as a diff) and commands; change nothing."
)
@json_option
@click.pass_context
def install(ctx, box, every, on_calendar, profile, timeout, on, mechanism, dry_run, as_json) -> None:
    """Write and enable the service + timer (or cron line) that runs the health check of BOX."""
    from ..schedule import check_calendar, desired_files, spec_from, target
    from ..schedule_step import ScheduleStep

    c = box_context(ctx, box, as_json=as_json, dry_run=dry_run)
    try:
        spec = spec_from(
            c.box,
            every=every,
            on_calendar=on_calendar,
            profile=profile,
            timeout=timeout,
            on=on,
            mechanism=mechanism,
        )
        if spec.on_calendar:
            check_calendar(spec.on_calendar, target(c, spec))
        report = run_steps(c, [ScheduleStep(spec)], "plan" if dry_run else "apply")
        report.extra["files"] = desired_files(target(c, spec), spec)
    finally:
        c.close()
    if dry_run and not as_json:
        _print_dry_run(report, box)
    emit(report, as_json, title=f"gpubox schedule install {box}" + (" (dry run)" if dry_run else ""))


def _print_dry_run(report, box: str) -> None:
    """The unit files in full (what would be installed), then the diff against what is there."""
    from gpubox.output import render_report

    con = console()
    for path, text in report.extra["files"].items():
        con.print(f"[bold]# {escape(path)}[/]")
        con.print(escape(text), soft_wrap=True)
    render_report(report, con, show_changes=False, title=f"gpubox schedule install {box} (dry run)")
    for s in report.steps:
        if s.diff and "--- /dev/null" not in s.diff:
            con.print(escape(s.diff), soft_wrap=True)
        for argv in s.commands:
            con.print("  would run: " + escape(" ".join(argv)), soft_wrap=True)
    sys.exit(report.exit_code)


@schedule.command()
@click.argument("box")
@on_option
@mech_option
@click.option("--dry-run", is_flag=True, help="Show what would be disabled and deleted; change nothing.")
@json_option
@click.pass_context
def remove(ctx, box, on, mechanism, dry_run, as_json) -> None:
    """Disable and delete BOX's scheduled health check."""
    from ..schedule import spec_from
    from ..schedule_remove_step import ScheduleRemoveStep

    c = box_context(ctx, box, as_json=as_json, dry_run=dry_run)
    try:
        spec = spec_from(c.box, on=on, mechanism=mechanism)
        report = run_steps(c, [ScheduleRemoveStep(spec)], "plan" if dry_run else "apply")
    finally:
        c.close()
    emit(report, as_json, title=f"gpubox schedule remove {box}" + (" (dry run)" if dry_run else ""))


@schedule.command()
@click.argument("box")
@on_option
@mech_option
@json_option
@click.pass_context
def status(ctx, box, on, mechanism, as_json) -> None:
    """Is the check installed, enabled and active, and how did the last run go? (exit 1: not running)"""
    from ..schedule import spec_from
    from ..schedule import status as get_status

    c = box_context(ctx, box, as_json=as_json)
    try:
        st = get_status(c, spec_from(c.box, on=on, mechanism=mechanism))
    finally:
        c.close()
    if as_json:
        print_json(st)
    else:
        t = Table(title=f"gpubox schedule status {box}", show_header=False)
        t.add_column("")
        t.add_column("", overflow="fold")
        t.add_row("where", f"{st['on']} ({st['host']}), {st['mechanism']}")
        t.add_row(
            "installed",
            ("yes" if st["installed"] else "[yellow]no[/]")
            + (
                ""
                if st["current"] or not st["installed"]
                else " [yellow](differs from what install writes)[/]"
            ),
        )
        if st["mechanism"] == "systemd":
            t.add_row("timer", f"{st.get('enabled')}, {st.get('active')}")
            if st.get("failing"):
                unit = escape(st["service"]) if st.get("service") else "the service"
                t.add_row(
                    "last service run",
                    f"[bold red]failed[/] (systemctl status {unit}; journalctl -u {unit})",
                )
        if st["installed"]:
            t.add_row("next run", escape(st.get("next_run") or "not scheduled (timer inactive?)"))
        last = st["last_run"]
        if last:
            style = {"healthy": "green", "degraded": "yellow"}.get(last["status"], "bold red")
            t.add_row(
                "last run",
                f"{last['started_at']}  [{style}]{last['status']}[/]  ({st['runs']} runs recorded)",
            )
            t.add_row("recorded in", escape(str(last.get("recorded"))))
            for msg in last["reasons"]:
                t.add_row("", escape(str(msg)))
        else:
            t.add_row("last run", "none recorded on the box")
        console().print(t)
    sys.exit(0 if st["ok"] else 1)


@schedule.command("run-once")
@click.argument("box")
@click.option("--profile", default=None, help="Benchmark profile (default: the schedule's, health).")
@click.option(
    "--from-json",
    "from_json",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Judge and record this result document instead of running the benchmark.",
)
@click.option(
    "--doctor/--no-doctor", default=True, show_default=True, help="Also export doctor's step findings."
)
@click.option(
    "--prom-dir", metavar="DIR", help="node_exporter textfile directory (default from the inventory)."
)
@click.option("--no-prom", is_flag=True, help="Do not write the .prom file.")
@json_option
@click.pass_context
def run_once(ctx, box, profile, from_json, doctor, prom_dir, no_prom, as_json) -> None:
    """Run one health check now (what the timer runs); exit 0 healthy, 1 degraded/failed, 2 could not run."""
    from ..runonce import run_once as do_run

    c = box_context(ctx, box, as_json=as_json)
    try:
        res = do_run(
            c,
            profile=profile,
            from_json=from_json,
            with_doctor=doctor,
            prom_dir=prom_dir,
            write_prom=not no_prom,
        )
    finally:
        c.close()
    if as_json:
        print_json(res)
    else:
        con = console()
        style = {"healthy": "green", "degraded": "yellow"}.get(res["status"], "bold red")
        con.print(f"{res['box']} {res['run_id']}: [{style}]{res['status']}[/]")
        for r in res["reasons"]:
            con.print(f"  - {escape(r.get('message', ''))}")
        con.print(f"  history: {escape(res['history'])}")
        if res["prom"]:
            con.print(f"  metrics: {escape(res['prom'])}")
        a = res["alert"]
        if a.get("fired"):
            con.print(
                f"  alert: {escape(' '.join(a['argv']))} -> {'ok' if a.get('ok') else escape(str(a.get('error')))}"
            )
        for n in res["notes"]:
            con.print(f"  [yellow]note:[/] {escape(n)}")
    sys.exit(0 if res["ok"] else 1)
