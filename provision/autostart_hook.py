"""What the hookscript and the boot unit run: each phase is `recover` with a selection of its steps
(the same steps, option gate and box lock as `gpubox recover`), bounded in time and logged.

- boot (the host unit, before pve-guests): host-devices, container-config, pcie-mrrs,
  numa-balancing. The container is not running yet, so a fixed config reaches this boot's start.
- pre-start (`<script> <vmid> pre-start`, after update_lxc_config wrote /var/lib/lxc/<vmid>/config:
  pve-container src/PVE/LXC.pm vm_start): host-devices applied, container-config checked. The whole
  start runs under Proxmox's config lock (src/PVE/API2/LXC/Status.pm: lock_config around vm_start),
  so stale rules are fixed by a detached `autostart boot --after-start` that waits for the start
  task to end (the fix reaches the next start either way); policy `refuse` aborts this start with
  one line (start it again), `degrade` lets it go on.
- post-start: every repair step but container-config, with restart never (live rules, CUDA probe,
  NCCL env, staging into /dev/shm), then the server unit is started (only on a clean run), then one
  health check exactly like a scheduled one (bench.runonce: history, Prometheus textfile, alert hook).
- pre-stop / post-stop: only a chained hookscript of the user's.

Every line goes to stderr (Proxmox's task log of the start; the journal for the boot unit) and to
/var/log/gpubox/autostart-ct<vmid>.log on the host.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from contextlib import contextmanager

from gpubox.errors import GpuboxError

from . import autostart as a

PHASES = ("pre-start", "post-start", "pre-stop", "post-stop")


class HookTimeout(BaseException):
    """The phase ran past its time limit (a BaseException: no step's error handling swallows it)."""


@contextmanager
def time_limit(seconds: int):
    def fire(signum, frame):
        raise HookTimeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(max(1, int(seconds)))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Log:
    """One line per event: `gpubox autostart ct200 pre-start: ...` on stderr and in the host's log file."""

    def __init__(self, ctx, spec: a.Spec, phase: str):
        self.ctx, self.spec, self.phase = ctx, spec, phase

    def __call__(self, msg: str) -> None:
        from gpubox.escape import terminal

        line = f"gpubox autostart {self.spec.box} {self.phase}: {terminal(msg)}"
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        try:
            host = self.ctx.host
            old = host.read_text(self.spec.log_path, default="")
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            host.makedirs(a.LOG_DIR)
            host.write(self.spec.log_path, (old + f"{stamp} {line}\n")[-1_000_000:], mode=0o640, backup=False)
        except (OSError, GpuboxError):
            pass  # the task log still has the line


def _problems(report) -> list[str]:
    return [f"{s.name}: {s.detail}" for s in report.steps if s.status in ("failed", "drift")]


def _recover(ctx, only=(), skip=()):
    from .recover import recover

    return recover(ctx, only=only, skip=skip, bench=False)


def _check(ctx, only):
    from .recover import doctor

    return doctor(ctx, (), only)


def defer_fix(ctx, spec: a.Spec, log) -> None:
    """The config fix for the next start, run once this start task ends: Proxmox holds the
    container's config lock (/run/lock/lxc/pve-config-<vmid>.lock) through the whole start, hook
    phases included (pve-container src/PVE/API2/LXC/Status.pm vm_start -> lock_config), so a write
    now would only time out. A detached `gpubox autostart boot BOX --after-start` waits for it."""
    import subprocess

    from gpubox.boxlock import HELD_ENV

    argv = spec.gpubox_argv() + ["boot", spec.box, "--after-start"]
    env = {k: v for k, v in os.environ.items() if k != HELD_ENV}  # it takes the box lock itself
    if spec.state_dir:
        env["GPUBOX_STATE_DIR"] = spec.state_dir
    subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outlives this hook and the start task
    )
    log(f"config fix deferred until the start task ends: {' '.join(argv)}")


def boot(ctx, spec: a.Spec, after_start: bool = False) -> int:
    log = Log(ctx, spec, "boot")
    if after_start:
        from .lxcconf import lock_path

        host, limit = ctx.host, spec.pre_timeout + spec.post_timeout
        r = host.run(["flock", "-w", str(limit), host.path(lock_path(spec.vmid)), "true"], timeout=limit + 30)
        log(f"the start task released CT {spec.vmid}'s config (flock exit {r.rc})")
    log(f"host side: {', '.join(a.HOST_STEPS)}")
    return _bounded(log, spec.pre_timeout, lambda: _boot(ctx, log))


def _boot(ctx, log) -> int:
    outcome = _recover(ctx, a.HOST_STEPS)
    for s in outcome.report.steps:
        log(f"{s.name} {s.status}: {s.detail}")
    return outcome.exit_code


def _bounded(log, seconds: int, fn, *, on_timeout: int = 1, on_error: int = 2) -> int:
    """fn() within its time limit. A phase stopped at its limit exits `on_timeout`; one that could
    not run (bad settings, the box lock held by another gpubox run) exits `on_error`."""
    t0 = time.monotonic()
    try:
        with time_limit(seconds):
            rc = fn()
    except HookTimeout:
        log(f"stopped: time limit of {seconds} s reached (exit {on_timeout})")
        sys.stderr.flush()
        os._exit(on_timeout)  # a step's threads must not keep the start waiting
    except GpuboxError as exc:
        log(f"could not run: {exc} (exit {on_error})")
        return on_error
    log(f"done in {time.monotonic() - t0:.1f} s, exit {rc}")
    return rc


def _chain(ctx, spec: a.Spec, chain: str, vmid: str, phase: str, log) -> int:
    """The user's own hookscript first, with the argv Proxmox gave us."""
    host = ctx.host
    r = host.run([host.path(chain), vmid, phase], timeout=spec.pre_timeout)
    for line in (r.stdout + r.stderr).splitlines():
        sys.stderr.write(line + "\n")
    log(f"chained {chain} exited {r.rc}")
    return r.rc


def hook(ctx, spec: a.Spec, vmid: str, phase: str, chain: str | None = None) -> int:
    """One hookscript call; the exit status is the hook's (non-zero in pre-start aborts the start)."""
    log = Log(ctx, spec, phase)
    if phase not in PHASES:
        log(f"unknown phase {phase!r}: nothing to do")
        return 0
    if str(vmid) != str(spec.vmid):
        log(f"called for CT {vmid}, but {spec.box} is CT {spec.vmid}: nothing done")
        return 2 if phase == "pre-start" else 0
    log(f"called as <script> {vmid} {phase} (policy {spec.policy})")
    user_rc = _chain(ctx, spec, chain, str(vmid), phase, log) if chain else 0
    if phase == "pre-start" and user_rc != 0:
        log(f"start refused by the chained hookscript (exit {user_rc})")
        return user_rc
    if phase == "pre-start":
        # Not checked (the lock is held by the gpubox run that asked for this start, say) is not
        # "cannot be made right": the start goes on. A check that hangs follows the policy.
        rc = _bounded(
            log,
            spec.pre_timeout,
            lambda: _pre_start(ctx, spec, log),
            on_timeout=1 if spec.policy == "refuse" else 0,
            on_error=0,
        )
    elif phase == "post-start":
        rc = _bounded(log, spec.post_timeout, lambda: _post_start(ctx, spec, log))
    else:
        rc = 0
    return user_rc or rc


def _pre_start(ctx, spec: a.Spec, log) -> int:
    """Nodes made now (no config write); the container's NVIDIA lines only checked: the start holds
    Proxmox's config lock, and update_lxc_config already wrote this start's config anyway."""
    nodes = _recover(ctx, ("host-devices",))
    bad = _problems(nodes.report)
    cfg = next(iter(_check(ctx, ("container-config",)).steps), None)
    if cfg is not None and cfg.status in ("drift", "failed"):
        defer_fix(ctx, spec, log)
        why = f"NVIDIA lines are stale ({cfg.detail})"
        if spec.policy == "refuse":
            log(f"start refused: {why}; the config is fixed once this task ends: start CT {spec.vmid} again")
            return 1
        log(
            f"degraded start: {why}; post-start applies live rules where it can, the next start gets the fixed config"
        )
        return 0
    if bad:
        if spec.policy == "refuse":
            log(f"start refused: {bad[0]}")
            return 1
        log(f"degraded start: {bad[0]}")
        return 0
    log("device nodes and rules match the live /proc/devices")
    return 0


def _post_start(ctx, spec: a.Spec, log) -> int:
    from gpubox.bench.runonce import run_once

    # every repair step but the config write (the start task holds the config's lock; the boot unit
    # and pre-start's deferred fix own it), with restart never: live rules, CUDA, NCCL env, staging
    outcome = _recover(ctx, skip=("container-config",))
    bad = _problems(outcome.report)
    for p in bad:
        log(f"not repaired: {p}")
    staged = [s for s in outcome.report.steps if s.name in ("model-stage", "drafter-stage")]
    log("container side: " + ", ".join(f"{s.name} {s.status}" for s in staged or outcome.report.steps[-1:]))
    if spec.server_unit:
        if bad:
            log(f"{spec.server_unit} not started: the box is not right ({bad[0]})")
        else:
            r = ctx.container.run(["systemctl", "start", spec.server_unit], timeout=120)
            log(
                f"{spec.server_unit} started"
                if r.rc == 0
                else f"{spec.server_unit} did not start: {r.stderr.strip()}"
            )
    ctx.forget()
    res = run_once(ctx, profile=spec.profile)
    log(f"health check: {res['status']} (run {res['run_id']}, history {res['history']})")
    return 0 if res["ok"] and not bad else 1
