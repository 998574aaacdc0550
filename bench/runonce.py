"""One scheduled health check, what the timer runs: lock, benchmark, judge, record, export, alert.

1. take the box's one lock on its Proxmox host (gpubox.boxlock; a second taker waits
   $GPUBOX_LOCK_WAIT seconds, then is refused naming the holder);
2. run `gpubox bench BOX --profile P --json` (the benchmark's own CLI, so the unit depends only
   on its documented output, docs/result-schema.md) or read a result file (--from-json);
3. judge it against the box's history and expectations (bench.regress) and record it;
4. optionally run doctor's checks for the per-step metrics;
5. write the node_exporter .prom file; 6. run the alert hook when degraded or failed.

A benchmark that cannot run at all still becomes a run in the history: a `failed` document with
the reason, so monitoring sees gpubox_health 2 instead of a silent gap.

The run keeps its own time limit (the schedule's `timeout`): the benchmark child runs in a process
group of its own, killed as a whole (its servers with it) when the limit is reached, and a SIGTERM
(coreutils `timeout` in the container, systemd stopping the unit) ends the run through the same
path: the benchmark's group killed, the run recorded as failed, the box lock released. What is
left of the limit after the benchmark decides whether doctor still runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpubox import areas
from gpubox.errors import GpuboxError

from . import alert, history, prom, regress


@contextmanager
def run_lock(ctx, what: str | None = None, wait: float | None = None, on: str = "host"):
    """The box's one lock (gpubox.boxlock: on its Proxmox host) for a measurement of it: a health
    check, a manual bench and any repair of the same box never overlap, whichever control node,
    state directory or front end started them. Yields the lock file's path on the host."""
    from gpubox.boxlock import box_lock

    with box_lock(ctx, what, wait, on) as info:
        yield info.path


@contextmanager
def _health_lock(ctx, what: str, notes: list[str]):
    """run-once's lock: the box's one lock on its Proxmox host, refused at once when held; when
    the container cannot reach its host (its inventory has no working connection to it), the
    same lock in the container, said in the notes, rather than no health check at all."""
    from contextlib import ExitStack

    from gpubox.errors import TransportError

    with ExitStack() as stack:
        try:
            path = stack.enter_context(run_lock(ctx, what, wait=0))
        except TransportError as exc:
            notes.append(f"box lock taken in the container only: the Proxmox host is not reachable ({exc})")
            path = stack.enter_context(run_lock(ctx, what, wait=0, on="container"))
        yield path


def failed_doc(
    box: str, profile: str, reason: str, started: float, simulated: bool = False
) -> dict[str, Any]:
    """A result document for a benchmark that did not produce one (built through the model, so it
    is the shape every reader loads)."""
    from .result_model import BenchResult, Facts, Reason, Tool, Verdict

    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    failed = Reason.build(
        level="failed",
        key=None,
        kind="run",
        message=f"benchmark did not run: {reason}",
        observed=None,
        expected=None,
    )
    return BenchResult.build(
        schema=history.SCHEMA,
        box=box,
        run_id=f"{box}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}",
        started_at=iso(started),
        finished_at=iso(time.time()),
        profile=profile,
        tool=Tool.build(version=_version()),
        simulated=simulated,
        facts=Facts.build(),
        servers=[],
        measurements=[],
        verdict=Verdict.build(status="failed", reasons=[failed]),
    ).to_dict()


def _version() -> str:
    from gpubox import __version__

    return __version__


CHILD_BOOT = "import sys;sys.path[:]=[p for p in sys.path if p[:1]=='/'];from gpubox.cli import main;main()"
RESERVE_S = 120  # of the time limit, kept for recording, metrics and the alert after the benchmark


class Stopped(GpuboxError):
    """The run was told to stop (SIGTERM): it ends through its finally blocks, then as one line."""

    def __init__(self, problem: str):
        super().__init__(problem, "raise gpubox_schedule.timeout if a health check needs longer")


@contextmanager
def stop_on_sigterm():
    """SIGTERM raises Stopped in the main thread while the run lasts, so the benchmark's process
    group is killed, the run recorded and the box lock released (a default SIGTERM would end the
    process with none of that done; the lock alone would drop with its pipe)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name} (the run's time limit)")

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _kill_group(p: subprocess.Popen, grace: float = 10) -> None:
    """TERM the child's whole process group, KILL what is left after GRACE seconds; return when
    the group is gone (the child reaped here; its own children are reaped by init)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            p.poll()
            try:
                os.killpg(p.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def run_child(argv: list[str], timeout: float, env: dict[str, str] | None = None):
    """(rc, stdout, stderr) of ARGV run in a process group of its own, or None when TIMEOUT passed
    (the whole group killed). A Stopped raised meanwhile kills the group too, then goes on up."""
    p = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own group: the servers it starts die with it
    )
    try:
        out, err = p.communicate(timeout=max(1.0, timeout))
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        _kill_group(p)
        p.communicate()
        return None
    except BaseException:
        _kill_group(p)
        raise


def run_benchmark(
    inventory: str | None,
    box: str,
    profile: str,
    timeout: float,
    simulated: bool,
    lock_path: Path | None = None,
) -> dict[str, Any]:
    """`gpubox bench BOX --profile P --json` as a child process; its document, or a failed one.

    The child takes the same per-box lock as any `gpubox bench`; `lock_path` (held by us) tells
    it that its parent already holds it."""
    t0 = time.time()
    # Not `-m gpubox.cli`: that puts the working directory first on sys.path, and a `gpubox/`
    # folder there would be imported instead of gpubox (a healthy box recorded as failed). The
    # child drops '' and relative entries before importing anything of ours (-P needs 3.11).
    argv = [sys.executable, "-c", CHILD_BOOT]
    if inventory:
        argv += ["-i", str(inventory)]
    argv += ["bench", box, "--profile", profile, "--json"]
    env = dict(os.environ)  # carries $GPUBOX_BOX_LOCK_HELD: the child re-enters our lock
    try:
        got = run_child(argv, timeout, env)
    except Stopped as exc:
        return failed_doc(box, profile, exc.problem, t0, simulated)
    if got is None:
        return failed_doc(box, profile, f"no result within the time limit of {timeout:g} s", t0, simulated)
    rc, out, err = got
    try:
        from .schema import parse

        doc = parse(out, "the benchmark's --json output")
        history.validate(doc, "the benchmark's --json output")
        return doc
    except (ValueError, GpuboxError):
        tail = (err.strip().splitlines() or [f"exit status {rc}, no result document"])[-1]
        return failed_doc(box, profile, tail, t0, simulated)


def doctor_report(ctx) -> dict[str, Any] | None:
    """Doctor's read-only checks as a RunReport dict. Doctor is the recover orchestration's, a
    layer above bench: it comes through the area registry (the "doctor" hook), not an import."""
    return areas.hook("doctor")(ctx)


def run_once(
    ctx,
    *,
    profile: str | None = None,
    from_json: str | None = None,
    with_doctor: bool = True,
    prom_dir: str | None = None,
    write_prom: bool = True,
    timeout: float | None = None,
) -> dict[str, Any]:
    """One health check of ctx.box; returns what happened (the CLI prints it)."""
    from .schedule import spec_from

    box = ctx.box
    spec = spec_from(box)
    profile = profile or spec.profile
    settings = regress.settings_from_box(box)
    argv = alert.command_of(box)  # validated before the long part
    alert_timeout = alert.timeout_of(box)
    prom_on = box.var("gpubox_prometheus_on", "container")
    if prom_on not in ("container", "host"):
        raise GpuboxError(f"gpubox_prometheus_on {prom_on!r} is not a place", "use container or host")
    prom_dir = prom_dir or box.var("gpubox_prometheus_textfile_dir", prom.DEFAULT_DIR)
    simulated = bool(box.var("gpubox_simulated", False))
    notes: list[str] = []
    limit = float(timeout or spec.timeout)
    deadline = time.monotonic() + limit
    # wait=0: a scheduled run is refused at once, never queued behind another (systemd's timer
    # already never starts a second one of its own; this covers recover, bench, other nodes).
    with stop_on_sigterm(), _health_lock(ctx, f"gpubox schedule run-once {box.name}", notes) as lock_path:
        if from_json:
            from .schema import load

            doc = load(from_json)  # strict JSON + bench.schema: one error naming file and field
            history.validate(doc, str(from_json))
            if doc["box"] != box.name or doc.get("box_id") not in (None, box.id):
                raise GpuboxError(
                    f"{from_json} is a result of {doc['box']} ({doc.get('box_id') or 'no identity'}), "
                    f"not {box.name} ({box.id})",
                    "give a result of this box",
                )
        else:
            inv = str(ctx.inventory.path) if ctx.inventory is not None else None
            bench_s = max(1.0, limit - min(RESERVE_S, 0.1 * limit))
            doc = run_benchmark(inv, box.name, profile, bench_s, simulated, lock_path)
        doc["box_id"] = box.id  # the history of this box (Proxmox host + vmid), never a namesake's
        doc = regress.with_verdict(doc, history.runs(box), settings)
        history.record(doc)
        doctor = None
        left = deadline - time.monotonic()
        if with_doctor and left < min(RESERVE_S, 0.1 * limit):
            notes.append(f"doctor did not run: {max(left, 0):.0f} s of the run's time limit left")
        elif with_doctor:
            try:
                doctor = doctor_report(ctx)
            except Stopped as exc:  # the run is recorded; what is left: metrics and the alert
                notes.append(f"doctor did not finish: {exc.problem}")
            except GpuboxError as exc:
                notes.append(f"doctor did not run: {exc}")
        prom_path = None
        if write_prom:
            host = ctx.host if prom_on == "host" else ctx.container
            try:
                # named by vmid, the box's identity where the file lives (a box name is not a path)
                prom_path = prom.write(host, f"ct{box.vmid}", prom.render(doc, doctor), prom_dir)
            except (OSError, GpuboxError) as exc:
                notes.append(f"metrics not written: {exc}")
        fired = alert.fire(ctx.container, argv, doc, alert_timeout)
        if fired.get("fired") and not fired.get("ok"):
            notes.append(f"alert command failed: {fired.get('error')}")
    v = doc["verdict"]
    return {
        "box": box.name,
        "run_id": doc["run_id"],
        "profile": doc.get("profile"),
        "status": v["status"],
        "ok": v["status"] == "healthy",
        "reasons": v.get("reasons", []),
        "history": str(history.store_path(box)),
        "prom": prom_path,
        "lock": str(lock_path),
        "doctor": None
        if doctor is None
        else {
            "ok": doctor.get("ok"),
            "problems": [
                s["name"] for s in doctor.get("steps", []) if s.get("status") in ("drift", "failed")
            ],
        },
        "alert": fired,
        "notes": notes,
    }
