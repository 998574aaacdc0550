"""Rendered units parse (`systemd-analyze verify`, plus a strict key check), cron lines, spans."""

import configparser
import os
import shutil
import subprocess

import pytest

from gpubox.bench import schedule
from gpubox.errors import GpuboxError
from gpubox.inventory import Box, HostEntry

ANALYZE = shutil.which("systemd-analyze")
GPUBOX = shutil.which("gpubox")

# The keys systemd knows in the sections we write (systemd.unit(5), .service(5), .exec(5),
# .kill(5), .timer(5)): an unknown key is only a warning for systemd, so check it ourselves too.
KNOWN = {
    "Unit": {"Description", "Documentation", "After", "Wants"},
    "Service": {"Type", "Environment", "ExecStart", "TimeoutStartSec", "KillMode", "Nice"},
    "Timer": {"OnActiveSec", "OnUnitActiveSec", "OnCalendar", "Persistent", "AccuracySec", "Unit"},
    "Install": {"WantedBy"},
}


def make_box(**sched):
    ct = HostEntry(
        "ct200",
        {"gpubox_vmid": 200, "gpubox_proxmox_host": "pve1", **({"gpubox_schedule": sched} if sched else {})},
    )
    return Box(container=ct, host=HostEntry("pve1", {}))


def strict_parse(text: str) -> dict[str, dict[str, str]]:
    cp = configparser.ConfigParser(
        strict=True, interpolation=None, delimiters=("=",), comment_prefixes=("#", ";")
    )
    cp.optionxform = str
    cp.read_string(text)
    out = {}
    for sec in cp.sections():
        assert sec in KNOWN, f"unknown section [{sec}]"
        unknown = set(cp[sec]) - KNOWN[sec]
        assert not unknown, f"unknown keys in [{sec}]: {unknown}"
        out[sec] = dict(cp[sec])
    return out


def verify(tmp_path, files: dict[str, str]):
    paths = []
    for name, text in files.items():
        p = tmp_path / name
        p.write_text(text)
        paths.append(str(p))
    env = dict(os.environ, SYSTEMD_LOG_LEVEL="notice")
    return subprocess.run(
        [ANALYZE, "verify", "--man=no", *paths], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    "sched",
    [
        {"every": "6h"},
        {"on_calendar": "*-*-* 00/6:00:00"},
        {"every": "30min", "timeout": "20min", "profile": "full"},
    ],
)
def test_units_pass_systemd_analyze_verify(tmp_path, sched):
    if ANALYZE is None or GPUBOX is None:
        pytest.skip("systemd-analyze or gpubox not on PATH")
    spec = schedule.spec_from(make_box(gpubox=GPUBOX, **sched))
    files = {spec.service: schedule.render_service(spec), spec.timer: schedule.render_timer(spec)}
    r = verify(tmp_path, files)
    assert r.returncode == 0, r.stderr
    # systemd only warns about unknown keys and bad values ("..., ignoring"): treat as failure
    bad = [l for l in r.stderr.splitlines() if "ignoring" in l or "Unknown" in l or "Failed" in l]
    assert not bad, bad


def test_verify_catches_a_broken_unit(tmp_path):
    """The check above can fail: a unit whose ExecStart does not exist is rejected."""
    if ANALYZE is None:
        pytest.skip("systemd-analyze not on PATH")
    spec = schedule.spec_from(make_box(gpubox="/nonexistent/gpubox"))
    r = verify(
        tmp_path, {spec.service: schedule.render_service(spec), spec.timer: schedule.render_timer(spec)}
    )
    assert r.returncode != 0 and "/nonexistent/gpubox" in r.stderr


def test_service_and_timer_content_is_strictly_valid():
    spec = schedule.spec_from(make_box(), every="6h", timeout="90min", profile="health")
    svc = strict_parse(schedule.render_service(spec))
    assert svc["Service"]["Type"] == "oneshot"
    assert svc["Service"]["TimeoutStartSec"] == "5400"
    assert svc["Service"]["Environment"] == "GPUBOX_STATE_DIR=/var/lib/gpubox"
    assert svc["Service"]["ExecStart"].split() == [
        "/usr/local/bin/gpubox",
        "-i",
        "/etc/gpubox/inventory.yml",
        "schedule",
        "run-once",
        "ct200",
        "--profile",
        "health",
    ]
    tim = strict_parse(schedule.render_timer(spec))
    assert tim["Timer"]["OnUnitActiveSec"] == "6h" and tim["Timer"]["OnActiveSec"] == "6h"
    assert tim["Timer"]["Unit"] == "gpubox-health-ct200.service"
    assert tim["Install"]["WantedBy"] == "timers.target"
    cal = schedule.spec_from(make_box(), on_calendar="Mon..Fri 03:00")
    tim = strict_parse(schedule.render_timer(cal))
    assert tim["Timer"]["OnCalendar"] == "Mon..Fri 03:00" and tim["Timer"]["Persistent"] == "true"
    assert "OnUnitActiveSec" not in tim["Timer"]


def test_host_mode_runs_through_pct_exec_with_state_dir_inside():
    spec = schedule.spec_from(make_box(on="host", pct="/usr/sbin/pct"))
    svc = strict_parse(schedule.render_service(spec))
    assert "Environment" not in svc["Service"]
    # the run's own time limit is enforced in the container (pct exec forwards no signal, so
    # systemd's TimeoutStartSec would kill only lxc-attach): coreutils timeout around the run there
    assert svc["Service"]["ExecStart"].split()[:9] == [
        "/usr/sbin/pct",
        "exec",
        "200",
        "--",
        "/usr/bin/timeout",
        "--kill-after=60",
        "7200s",
        "/usr/bin/env",
        "GPUBOX_STATE_DIR=/var/lib/gpubox",
    ]
    # systemd's limit is only a backstop past the inner TERM + KILL
    assert int(svc["Service"]["TimeoutStartSec"]) == 7200 + 60 + 60


def test_cli_options_override_inventory_and_every_defaults_to_6h():
    spec = schedule.spec_from(make_box(on_calendar="daily", profile="full"), every="4h")
    assert spec.every == 4 * 3600 and spec.on_calendar is None and spec.profile == "full"
    assert schedule.spec_from(make_box()).every == 6 * 3600


@pytest.mark.parametrize(
    "every, cron",
    [
        ("6h", "0 */6 * * *"),
        ("1h", "0 * * * *"),
        ("30min", "*/30 * * * *"),
        ("1d", "0 0 * * *"),
        ("12h", "0 */12 * * *"),
    ],
)
def test_cron_line(every, cron):
    spec = schedule.spec_from(make_box(), every=every, timeout="1h")
    text = schedule.render_cron(spec)
    line = [l for l in text.splitlines() if l and not l.startswith("#") and "=" not in l.split()[0]][0]
    fields = line.split()
    assert " ".join(fields[:5]) == cron and fields[5] == "root"
    assert fields[6:10] == ["timeout", "--kill-after=60", "3600", "/usr/local/bin/gpubox"]
    assert "GPUBOX_STATE_DIR=/var/lib/gpubox" in text.splitlines()


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"every": "5h"}, "cron schedule"),
        ({"on_calendar": "daily"}, "needs systemd"),
    ],
)
def test_cron_refuses_what_it_cannot_express(kw, words):
    spec = schedule.spec_from(make_box(), **kw)
    with pytest.raises(GpuboxError, match=words):
        schedule.render_cron(spec)


@pytest.mark.parametrize(
    "sched, cli, words",
    [
        ({}, {"every": "6h", "on_calendar": "daily"}, "either --every or --on-calendar"),
        ({}, {"every": "six hours"}, "not a time span"),
        ({}, {"every": "1min"}, "shorter than"),
        ({"gpubox": "/usr/bin/gpubox; rm -rf /"}, {}, "cannot carry safely"),
        ({"inventory": "relative/inv.yml"}, {}, "absolute path"),
        ({"on": "moon"}, {}, "not a place"),
        ({}, {"profile": "health $(id)"}, "cannot carry safely"),
    ],
)
def test_bad_settings_are_one_line_errors(sched, cli, words):
    with pytest.raises(GpuboxError, match=words) as ei:
        schedule.spec_from(make_box(**sched), **cli)
    assert "\n" not in str(ei.value)


def test_on_calendar_is_validated_by_systemd_analyze():
    if ANALYZE is None:
        pytest.skip("systemd-analyze not on PATH")
    assert schedule.check_calendar("*-*-* 00/6:00:00") == "*-*-* 00/6:00:00"
    with pytest.raises(GpuboxError, match="not valid"):
        schedule.check_calendar("every tuesday-ish")


def test_unit_names_are_cron_safe():
    assert schedule.unit_base(200) == "gpubox-health-ct200"
    assert schedule.format_span(21600) == "6h" and schedule.format_span(90) == "90s"
    assert schedule.parse_span("1d", "x") == 86400 and schedule.parse_span("45", "x") == 45
