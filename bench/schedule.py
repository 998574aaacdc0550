"""Scheduled health checks: a systemd service + timer (or a cron.d line) on the box.

The spec, its validation and the unit and cron text it renders are one contract, kept in one module
(about 500 lines): split, each setting would be spread over three files.

What gets installed runs `gpubox -i <inventory> schedule run-once <box> --profile <p>` (see
bench/runonce.py: lock, benchmark, history, verdict, .prom file, alert). By default the units go
into the container; with `on: host` they go onto the Proxmox host and reach the container with
`pct exec <vmid> --`. Either way gpubox itself runs in the container, so it must be installed
there (docs/schedule.md).

    gpubox-health-<box>.service   Type=oneshot, TimeoutStartSec = the time limit
    gpubox-health-<box>.timer     OnActiveSec + OnUnitActiveSec (--every) or OnCalendar

Overlap: run-once takes an exclusive lock (bench.runonce.run_lock), and systemd never starts a
unit that is still activating, so a slow run delays the next one instead of doubling up.

Time limit: the run keeps its own (run-once's deadline; coreutils `timeout` around it in the
container for `on: host`). systemd's TimeoutStartSec alone is not enough there: `pct exec` runs
`lxc-attach`, which forwards no signal without a terminal, so when systemd kills the unit only
lxc-attach dies and a hung benchmark would run on in the container, holding the box lock. So with
`on: host` the command in the container is `timeout --kill-after=60 <limit>s ...` (TERM to the
run's process group, KILL a minute later) and systemd's limit is set past that, as a backstop.
Where systemd is absent (no /run/systemd/system, the test sd_booted(3) uses), a line in
/etc/cron.d/ does the same under `timeout`.

Inventory (all optional; CLI options win):

    gpubox_schedule:
      every: 6h                 # or on_calendar: "*-*-* 00/6:00:00"
      profile: health
      on: container             # container | host
      timeout: 2h               # time limit of one run
      gpubox: /usr/local/bin/gpubox            # gpubox in the container
      inventory: /etc/gpubox/inventory.yml     # inventory gpubox reads there
      state_dir: /var/lib/gpubox               # history + lock there (GPUBOX_STATE_DIR)
      pct: /usr/sbin/pct
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.facts import Fact

# Tokens that go into ExecStart= and a cron line. Refusing everything else (spaces, quotes, %,
# $, ;, backslashes) means neither systemd's specifier/variable expansion nor /bin/sh (cron) can
# reinterpret a value, so no quoting layer is needed.
_SAFE = re.compile(r"^[A-Za-z0-9_./:@+=,-]+$")
_SPAN = re.compile(r"^\s*(\d{1,12})\s*(s|sec|m|min|h|d)?\s*$", re.A)  # ASCII digits only
MAX_SPAN = 366 * 86400  # a year and a day: systemd and cron both carry it; beyond is a typo
# What an OnCalendar= spec is made of (systemd.time(7) "Calendar Events"): weekdays, dates,
# times, ranges/lists/repetitions, `~` (last days), a timezone name; a shorthand like `daily`.
# Checked before systemd-analyze (and where there is none), so `--help` or `-x` never reaches it.
_CAL_TOKEN = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9*:./,~+_-]*$", re.A)
_UNIT_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, None: 1}
MIN_EVERY = 300
DEFAULTS = {
    "every": None,
    "on_calendar": None,
    "profile": "health",
    "on": "container",
    "timeout": "2h",
    "gpubox": "/usr/local/bin/gpubox",
    "inventory": "/etc/gpubox/inventory.yml",
    "state_dir": "/var/lib/gpubox",
    "pct": "/usr/sbin/pct",
    "mechanism": "auto",
}
UNIT_DIR = "/etc/systemd/system"
CRON_DIR = "/etc/cron.d"
TIMEOUT = "/usr/bin/timeout"  # coreutils, in the container (checked there at install)
KILL_AFTER = 60  # seconds between timeout's TERM and its KILL


def parse_span(text: Any, what: str) -> int:
    """'6h', '30min', '90s', '1d' or plain seconds -> seconds."""
    m = _SPAN.match(str(text))
    if not m or int(m.group(1)) <= 0:
        raise GpuboxError(f"{what} {text!r} is not a time span", "write it like 30min, 6h or 1d")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > MAX_SPAN:
        raise GpuboxError(
            f"{what} {text!r} is longer than {format_span(MAX_SPAN)}", "write a span of at most a year"
        )
    return seconds


def calendar_shape(spec: Any) -> str:
    """A strict check of an OnCalendar spec's form, needing no systemd: at most 4 blank-separated
    tokens of calendar characters, none starting with `-` (an option to systemd-analyze)."""
    text = str(spec) if spec is not None else ""
    tokens = text.split(" ")
    if not text or len(tokens) > 4 or not all(_CAL_TOKEN.fullmatch(t) for t in tokens):
        raise GpuboxError(
            f"--on-calendar {text!r} is not a calendar spec",
            'see systemd.time(7); e.g. "*-*-* 00/6:00:00", "Mon..Fri 03:00" or daily',
        )
    return text


def format_span(seconds: int) -> str:
    """Seconds as the largest exact systemd unit: 21600 -> '6h'."""
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"


def safe_token(value: Any, what: str) -> str:
    s = str(value)
    if not _SAFE.match(s):
        raise GpuboxError(
            f"{what} {s!r} has characters a unit or cron line cannot carry safely",
            "use letters, digits and . _ / : @ + = , - only",
        )
    return s


def unit_base(vmid: int) -> str:
    """`gpubox-health-ct<vmid>`: the units and cron file live on the box's own container or
    Proxmox host, where the vmid is the container's identity (gpubox.identity: the box_id's part
    on its own host). A slug of the box name was lossy: boxes gpu.a and gpu_a got one unit, and
    the second install replaced the first box's health check. cron.d names stay [A-Za-z0-9_-]."""
    return f"gpubox-health-ct{int(vmid)}"


def check_calendar(spec: str, host=None) -> str:
    """Validate an OnCalendar spec with `systemd-analyze calendar` (on the target, else here)."""
    calendar_shape(spec)
    argv = ["systemd-analyze", "calendar", "--", spec]  # `--`: a spec is never an option
    r = host.run(argv, timeout=20) if host is not None else None
    if r is None or r.rc == 127:
        exe = shutil.which("systemd-analyze")
        if not exe:
            return spec  # nothing more to validate with: calendar_shape above was the strict check
        p = subprocess.run([exe, "calendar", "--", spec], capture_output=True, text=True, timeout=20)
        rc, err = p.returncode, p.stderr
    else:
        rc, err = r.rc, r.stderr
    if rc != 0:
        msg = (err.strip().splitlines() or ["invalid"])[-1]
        raise GpuboxError(
            f"--on-calendar {spec!r} is not valid: {msg}",
            'see systemd.time(7); e.g. "*-*-* 00/6:00:00", "Mon..Fri 03:00"',
        )
    return spec


@dataclass
class Spec:
    """One box's schedule, validated."""

    box: str
    vmid: int
    every: int | None = None
    on_calendar: str | None = None
    profile: str = "health"
    on: str = "container"
    timeout: int = 7200
    gpubox: str = DEFAULTS["gpubox"]
    inventory: str = DEFAULTS["inventory"]
    state_dir: str = DEFAULTS["state_dir"]
    pct: str = DEFAULTS["pct"]
    mechanism: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return unit_base(self.vmid)

    @property
    def service(self) -> str:
        return self.base + ".service"

    @property
    def timer(self) -> str:
        return self.base + ".timer"

    @property
    def cron_file(self) -> str:
        return f"{CRON_DIR}/{self.base}"

    @property
    def log_file(self) -> str:
        return f"/var/log/{self.base}.log"

    def run_argv(self) -> list[str]:
        """The health check's command line on the unit's host (argv)."""
        inner = [
            self.gpubox,
            "-i",
            self.inventory,
            "schedule",
            "run-once",
            self.box,
            "--profile",
            self.profile,
        ]
        if self.on == "host":
            # The unit's Environment= would reach only pct: hand the state dir to the inner command.
            # The time limit is enforced in the container, where the run is (module docstring).
            return [
                self.pct,
                "exec",
                str(self.vmid),
                "--",
                TIMEOUT,
                f"--kill-after={KILL_AFTER}",
                f"{self.timeout}s",
                "/usr/bin/env",
                f"GPUBOX_STATE_DIR={self.state_dir}",
                *inner,
            ]
        return inner

    @property
    def unit_timeout(self) -> int:
        """systemd's TimeoutStartSec: the run's limit in the container, or (on the host, where it
        can kill only pct) a backstop a little past the inner timeout's KILL."""
        return self.timeout + (KILL_AFTER + 60 if self.on == "host" else 0)


def spec_from(box, **cli: Any) -> Spec:
    """Merge CLI options over the box's gpubox_schedule over the defaults, and validate."""
    inv = box.var("gpubox_schedule") or {}
    if not isinstance(inv, dict):
        raise GpuboxError(f"box {box.name}: gpubox_schedule is not a mapping", "see docs/schedule.md")
    cfg = dict(DEFAULTS)
    cfg.update({k: v for k, v in inv.items() if v is not None})
    if cli.get("every") or cli.get("on_calendar"):
        cfg["every"], cfg["on_calendar"] = None, None
    cfg.update({k: v for k, v in cli.items() if v is not None})
    if cfg["every"] and cfg["on_calendar"]:
        raise GpuboxError("give either --every or --on-calendar, not both", "e.g. --every 6h")
    if not cfg["every"] and not cfg["on_calendar"]:
        cfg["every"] = "6h"
    every = parse_span(cfg["every"], "--every") if cfg["every"] else None
    if every is not None and every < MIN_EVERY:
        raise GpuboxError(
            f"--every {cfg['every']} is shorter than {format_span(MIN_EVERY)}",
            "a health benchmark occupies the GPUs for minutes; schedule it hours apart",
        )
    if cfg["on_calendar"]:
        calendar_shape(cfg["on_calendar"])  # every front end, before anything is written
    if cfg["on"] not in ("container", "host"):
        raise GpuboxError(f"schedule on {cfg['on']!r} is not a place", "use container or host")
    if cfg["mechanism"] not in ("auto", "systemd", "cron"):
        raise GpuboxError(f"mechanism {cfg['mechanism']!r} is unknown", "use auto, systemd or cron")
    for k in ("gpubox", "inventory", "state_dir", "pct"):
        safe_token(cfg[k], f"gpubox_schedule.{k}")
        if not str(cfg[k]).startswith("/"):
            raise GpuboxError(
                f"gpubox_schedule.{k} {cfg[k]!r} is not an absolute path",
                "units and cron need absolute paths",
            )
    safe_token(cfg["profile"], "--profile")
    safe_token(box.name, "box name")
    return Spec(
        box=box.name,
        vmid=box.vmid,
        every=every,
        on_calendar=cfg["on_calendar"],
        profile=str(cfg["profile"]),
        on=cfg["on"],
        timeout=parse_span(cfg["timeout"], "timeout"),
        gpubox=str(cfg["gpubox"]),
        inventory=str(cfg["inventory"]),
        state_dir=str(cfg["state_dir"]),
        pct=str(cfg["pct"]),
        mechanism=cfg["mechanism"],
    )


# -- rendering -----------------------------------------------------------------------------
def render_service(s: Spec) -> str:
    where = f"via pct exec {s.vmid} from the Proxmox host" if s.on == "host" else "in the container"
    env = "" if s.on == "host" else f"Environment=GPUBOX_STATE_DIR={s.state_dir}\n"
    return (
        "# Written by gpubox (gpubox schedule install); remove with: gpubox schedule remove "
        f"{s.box}\n"
        "[Unit]\n"
        f"Description=gpubox {s.profile} benchmark of {s.box} ({where})\n"
        "Documentation=man:systemd.timer(5)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"{env}"
        f"ExecStart={' '.join(s.run_argv())}\n"
        # A oneshot's whole run is its start-up, so TimeoutStartSec= is its time limit
        # (systemd.service(5): RuntimeMaxSec= has no effect on Type=oneshot).
        f"TimeoutStartSec={s.unit_timeout}\n"
        # Exit 1 (degraded/failed verdict) leaves the unit "failed": visible in systemctl --failed.
        "KillMode=mixed\n"
        "Nice=5\n"
    )


def render_timer(s: Spec) -> str:
    if s.on_calendar:
        when = f"OnCalendar={s.on_calendar}\nPersistent=true\n"
        what = s.on_calendar
    else:
        span = format_span(s.every)
        # OnActiveSec: the first run one interval after the timer starts (at boot, or at
        # install), not at once; then OnUnitActiveSec repeats it.
        when = f"OnActiveSec={span}\nOnUnitActiveSec={span}\n"
        what = f"every {span}"
    return (
        "# Written by gpubox (gpubox schedule install)\n"
        "[Unit]\n"
        f"Description=gpubox {s.profile} benchmark of {s.box}, {what}\n"
        "\n"
        "[Timer]\n"
        f"{when}"
        "AccuracySec=1min\n"
        f"Unit={s.service}\n"
        "\n"
        "[Install]\n"
        "WantedBy=timers.target\n"
    )


def cron_schedule(s: Spec) -> str:
    if s.on_calendar:
        raise GpuboxError(
            f"--on-calendar needs systemd, which {s.box}'s {s.on} does not run",
            "use --every (e.g. 6h), which cron can express",
        )
    e = s.every
    if e % 86400 == 0 and e == 86400:
        return "0 0 * * *"
    if e % 3600 == 0 and 24 % (e // 3600) == 0:
        return f"0 */{e // 3600} * * *" if e > 3600 else "0 * * * *"
    if e % 60 == 0 and 60 % (e // 60) == 0:
        return f"*/{e // 60} * * * *"
    raise GpuboxError(
        f"--every {format_span(e)} cannot be written as a cron schedule",
        "use a divisor of an hour or a day (e.g. 30min, 2h, 4h, 6h, 12h, 1d), or systemd",
    )


def render_cron(s: Spec) -> str:
    # Time limit: coreutils timeout (TERM, then KILL a minute later). Overlap: run-once's lock.
    cmd = " ".join(["timeout", f"--kill-after={KILL_AFTER}", str(s.unit_timeout), *s.run_argv()])
    return (
        f"# Written by gpubox (gpubox schedule install); remove with: gpubox schedule remove {s.box}\n"
        "SHELL=/bin/sh\n"
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"GPUBOX_STATE_DIR={s.state_dir}\n"
        f"{cron_schedule(s)} root {cmd} >>{s.log_file} 2>&1\n"
    )


# -- where, how ----------------------------------------------------------------------------
def target(ctx, s: Spec):
    return ctx.host if s.on == "host" else ctx.container


def uses_systemd(host, s: Spec) -> bool:
    if s.mechanism != "auto":
        return s.mechanism == "systemd"
    return host.exists("/run/systemd/system")


def desired_files(host, s: Spec) -> dict[str, str]:
    return wanted_files(s, uses_systemd(host, s))


def _read(host, path: str) -> str | None:
    try:
        return host.read_text(path)
    except FileNotFoundError:
        return None


def unit_state(host, unit: str) -> dict[str, str]:
    out = {}
    for verb in ("is-enabled", "is-active"):
        r = host.run(["systemctl", verb, unit], timeout=20)
        out[verb] = (r.stdout.strip().splitlines() or ["unknown"])[0] if r.rc != 127 else "no systemctl"
    return out


# -- facts: read on the schedule's target (the Proxmox host or the container) -------------------
def _on(ctx, on: str):
    return ctx.host if on == "host" else ctx.container


class TargetExists(Fact):
    """Does a path exist on the host (`on`="host") or in the container? Read with the context
    because the schedule's `on` picks the machine."""

    where = "box"

    @staticmethod
    def read(ctx, on: str, path: str) -> bool:
        return _on(ctx, on).exists(path)


class TargetText(Fact):
    """A file's text there, None when it is absent."""

    where = "box"

    @staticmethod
    def read(ctx, on: str, path: str) -> str | None:
        return _read(_on(ctx, on), path)


class TimerState(Fact):
    """`systemctl is-enabled` / `is-active` of a unit there (what unit_state reads)."""

    where = "box"

    @staticmethod
    def read(ctx, on: str, unit: str) -> dict[str, str]:
        return unit_state(_on(ctx, on), unit)


def file_paths(s: Spec, systemd: bool) -> list[str]:
    """The files a schedule consists of: the service and timer units, or the cron.d file."""
    return [f"{UNIT_DIR}/{s.service}", f"{UNIT_DIR}/{s.timer}"] if systemd else [s.cron_file]


def wanted_files(s: Spec, systemd: bool) -> dict[str, str]:
    """Pure: the files and their text for this spec (desired_files without reading the target)."""
    if systemd:
        return {f"{UNIT_DIR}/{s.service}": render_service(s), f"{UNIT_DIR}/{s.timer}": render_timer(s)}
    return {s.cron_file: render_cron(s)}


def recorded_runs(ctx, s: Spec) -> list[dict[str, Any]]:
    """Every recorded run of the box, in time order: the scheduled ones (the timer writes the
    history in the container, under the schedule's state_dir) and `gpubox schedule run-once`'s
    from here (this machine's state dir), each run once (by run_id)."""
    from . import history

    key = history.store_key(ctx.box)  # the box's identity: run-once records under it
    where = f"{s.state_dir}/history/{key}.jsonl"
    text = _read(ctx.container, where)
    runs = [dict(r, _where=f"{ctx.container.name}:{where}") for r in history.parse_lines(text or "")]
    local = history.store_path(ctx.box)
    if local.exists():
        runs += [dict(r, _where=str(local)) for r in history.parse_lines(local.read_text(encoding="utf-8"))]
    runs = [r for r in runs if history.doc_key(r) == key]  # never a namesake box's runs
    seen, out = set(), []
    for r in sorted(runs, key=lambda r: str(r.get("started_at") or "")):
        key = r.get("run_id") or id(r)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def failed_service(ctx, s: Spec) -> str | None:
    """The schedule's service unit when systemd says its last run failed (gpubox exited non-zero),
    else None: a run that failed before recording anything leaves the history's newest verdict in
    place, so a listing of the history alone would show a failing check as healthy."""
    h = target(ctx, s)
    if not uses_systemd(h, s):
        return None
    return s.service if unit_state(h, s.service)["is-active"] == "failed" else None


def next_elapse(host, timer: str) -> str | None:
    """When systemd runs the timer next (`systemctl show -p NextElapseUSecRealtime --value`), as
    systemd prints it; None when it says nothing ("n/a", empty, or no systemctl)."""
    r = host.run(["systemctl", "show", timer, "--property=NextElapseUSecRealtime", "--value"], timeout=20)
    v = r.stdout.strip() if r.rc == 0 else ""
    return v if v and v != "n/a" else None


def next_cron_run(every: int, now: float) -> str:
    """The next time cron starts the check: gpubox's cron lines fire at the multiples of `every`
    from midnight (it divides an hour or a day; see cron_schedule), in the box's local time,
    taken as this machine's."""
    t = time.localtime(now)
    midnight = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))
    n = int((now - midnight) // every) + 1
    return time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(midnight + n * every))


def status(ctx, s: Spec) -> dict[str, Any]:
    """Installed? enabled/active? and the last run recorded on the box."""

    h = target(ctx, s)
    systemd = uses_systemd(h, s)
    files = desired_files(h, s)
    present = {p: _read(h, p) for p in files}
    out: dict[str, Any] = {
        "box": s.box,
        "on": s.on,
        "host": h.name,
        "mechanism": "systemd" if systemd else "cron",
        "installed": all(v is not None for v in present.values()),
        "current": all(present[p] == c for p, c in files.items()),
        "files": sorted(files),
    }
    if systemd:
        st = unit_state(h, s.timer)
        out.update(
            enabled=st["is-enabled"],
            active=st["is-active"],
            last_service_state=unit_state(h, s.service)["is-active"],
            service=s.service,
        )
    if systemd:
        out["next_run"] = next_elapse(h, s.timer)
    elif out["installed"] and s.every:
        out["next_run"] = next_cron_run(s.every, time.time())
    else:
        out["next_run"] = None
    runs = recorded_runs(ctx, s)
    last = runs[-1] if runs else None
    out["runs"] = len(runs)
    out["last_run"] = (
        None
        if last is None
        else {
            "run_id": last.get("run_id"),
            "started_at": last.get("started_at"),
            "finished_at": last.get("finished_at"),
            "status": (last.get("verdict") or {}).get("status"),
            "recorded": last.get("_where"),
            "reasons": [r.get("message") for r in (last.get("verdict") or {}).get("reasons") or []],
        }
    )
    # A timer that is enabled and active but whose service's last run failed (gpubox exited non-zero:
    # a degraded/failed verdict, or it could not run at all) is a failing check, not a healthy one.
    out["failing"] = systemd and out.get("last_service_state") == "failed"
    out["ok"] = bool(
        out["installed"]
        and out["current"]
        and (not systemd or (out.get("enabled") == "enabled" and out.get("active") == "active"))
        and not out["failing"]
    )
    return out
