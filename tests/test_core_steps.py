"""The step engine: check / plan / apply / verify, requires, errors, and the result record.

The steps here are small but real: they read and write a file under a host's gpubox_root through
the local transport, so "nothing changed" and "second run changes nothing" are checked on disk.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

import pytest

from gpubox.clihelp import emit
from gpubox.context import Context
from gpubox.errors import GpuboxError, TransportError
from gpubox.inventory import Box, HostEntry
from gpubox.output import console, render_report
from gpubox.pipeline import run_steps
from gpubox.steps import MODES, Action, Finding, Plan, RunReport, Step

KNOB = "/proc/sys/kernel/numa_balancing"


class KnobStep(Step):
    """Desired value of a sysctl-like file on the Proxmox host."""

    name = "numa-balancing"
    title = "NUMA balancing off"
    where = "host"

    def __init__(self, want="0", sabotage=False, name=None, requires=()):
        self.want, self.sabotage = want, sabotage
        if name:
            self.name = name
        self.requires = tuple(requires)

    def check(self, ctx):
        have = ctx.host.read_text(KNOB).strip()
        if have == self.want:
            return Finding.ok(f"{KNOB} = {have}", value=have)
        return Finding.drift(
            f"{KNOB} = {have}, want {self.want}",
            cause="reset by the reboot",
            repair=f"write {self.want}",
            value=have,
        )

    def plan(self, ctx, finding):
        old = ctx.host.read_text(KNOB)
        diff = "".join(difflib.unified_diff(old.splitlines(True), [self.want + "\n"], KNOB, KNOB))
        return Plan(f"set {KNOB} to {self.want}", actions=[SetKnob(self.want, diff, self.sabotage)])


@dataclass
class SetKnob(Action):
    """The knob write as an action: a dry run shows the sysctl argv and the diff; execute writes."""

    want: str
    shown_diff: str
    sabotage: bool = False

    def describe(self, host):
        return [["sysctl", "-w", f"kernel.numa_balancing={self.want}"]]

    def diff(self):
        return self.shown_diff

    def execute(self, run):
        run.host().write(KNOB, ("7" if self.sabotage else self.want) + "\n")


class ContainerProbe(Step):
    name = "probe"
    where = "container"

    def __init__(self, exc=None, requires=()):
        self.exc, self.requires = exc, tuple(requires)
        self.ran = False

    def check(self, ctx):
        self.ran = True
        if self.exc:
            raise self.exc
        return Finding.ok("fine")


@pytest.fixture
def ctx(tmp_path):
    root = tmp_path / "pve1"
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / KNOB.lstrip("/")).write_text("1\n")
    host = HostEntry("pve1", {"ansible_connection": "local", "gpubox_root": str(root)})
    ct = HostEntry(
        "ct200",
        {
            "ansible_connection": "local",
            "gpubox_root": str(tmp_path / "ct200"),
            "gpubox_vmid": 200,
            "gpubox_proxmox_host": "pve1",
        },
    )
    c = Context(box=Box(container=ct, host=host))
    c.knob = root / KNOB.lstrip("/")
    yield c
    c.close()


def test_check_mode_reports_drift_and_changes_nothing(ctx):
    r = run_steps(ctx, [KnobStep()], "check")
    s = r.steps[0]
    assert (s.status, s.changed, s.host, s.diff, s.commands) == ("drift", False, "pve1", "", [])
    assert s.cause == "reset by the reboot" and s.evidence == {"value": "1"}
    assert (r.ok, r.exit_code, r.box, r.mode) == (False, 1, "ct200", "check")
    assert ctx.knob.read_text() == "1\n"


def test_plan_mode_shows_exact_change_and_changes_nothing(ctx):
    r = run_steps(ctx, [KnobStep()], "plan")
    s = r.steps[0]
    assert s.status == "drift" and not s.changed
    assert "-1\n+0\n" in s.diff and s.diff.startswith(f"--- {KNOB}")
    assert s.commands == [["sysctl", "-w", "kernel.numa_balancing=0"]]
    assert s.detail.endswith(f"; would set {KNOB} to 0")
    assert ctx.knob.read_text() == "1\n" and r.exit_code == 1


def test_apply_fixes_verifies_and_second_run_changes_nothing(ctx):
    r = run_steps(ctx, [KnobStep()], "apply")
    s = r.steps[0]
    assert (s.status, s.changed, r.ok, r.changed, r.exit_code) == ("fixed", True, True, True, 0)
    assert "verified" in s.detail and s.cause == "reset by the reboot"
    assert ctx.knob.read_text() == "0\n"
    again = run_steps(ctx, [KnobStep()], "apply")
    assert [(x.status, x.changed) for x in again.steps] == [("ok", False)]
    assert not again.changed and again.exit_code == 0


def test_verify_failure_is_failed(ctx):
    r = run_steps(ctx, [KnobStep(sabotage=True)], "apply")
    s = r.steps[0]
    assert (s.status, s.changed) == ("failed", True)
    assert s.detail.startswith("applied but verify says:") and "= 7" in s.detail
    assert r.exit_code == 1


def test_requires_blocks_in_apply_mode_only(ctx):
    first = KnobStep(sabotage=True, name="knob")
    second = ContainerProbe(requires=("knob",))
    r = run_steps(ctx, [first, second], "apply")
    assert [s.status for s in r.steps] == ["failed", "skipped"]
    assert r.steps[1].evidence == {"blocked_by": ["knob"]} and not second.ran
    assert "knob" in r.steps[1].repair and r.steps[1].host == "ct200"
    assert not r.ok
    # In check mode the dependent step still reports what it sees.
    ctx.knob.write_text("1\n")
    second = ContainerProbe(requires=("knob",))
    r = run_steps(ctx, [KnobStep(name="knob"), second], "check")
    assert [s.status for s in r.steps] == ["drift", "ok"] and second.ran


def test_requires_satisfied_by_fixed_step(ctx):
    second = ContainerProbe(requires=("numa-balancing",))
    r = run_steps(ctx, [KnobStep(), second], "apply")
    assert [s.status for s in r.steps] == ["fixed", "ok"] and r.ok


def test_gpubox_error_fails_only_that_step(ctx):
    bad = ContainerProbe(GpuboxError("model dir /mnt/models/x missing", "mount it"))
    r = run_steps(ctx, [bad, KnobStep()], "check")
    assert r.steps[0].status == "failed"
    assert r.steps[0].detail == "model dir /mnt/models/x missing (mount it)"
    assert r.steps[1].status == "drift"  # the run went on


def test_unexpected_exception_is_reported_as_internal_error(ctx):
    r = run_steps(ctx, [ContainerProbe(KeyError("gpus")), KnobStep()], "check")
    assert r.steps[0].status == "failed" and r.steps[0].detail == "internal error: KeyError: 'gpus'"
    assert "-v" in r.steps[0].repair and len(r.steps) == 2


def test_transport_error_propagates(ctx):
    with pytest.raises(TransportError, match="cannot reach"):
        run_steps(ctx, [ContainerProbe(TransportError("pve1: cannot reach 10.0.0.1:22: timed out"))], "check")


def test_modes_and_callback(ctx):
    assert MODES == ("check", "plan", "apply")
    with pytest.raises(ValueError):
        run_steps(ctx, [KnobStep()], "fix")
    seen = []
    run_steps(ctx, [KnobStep(), ContainerProbe()], "check", on_result=lambda s: seen.append(s.name))
    assert seen == ["numa-balancing", "probe"]


def test_report_json_shape_matches_the_issue(ctx):
    r = run_steps(ctx, [KnobStep(), ContainerProbe(GpuboxError("x"))], "plan")
    doc = json.loads(json.dumps(r.to_dict()))
    assert {"box", "steps", "ok"} <= set(doc) and doc["box"] == "ct200" and doc["ok"] is False
    for s in doc["steps"]:
        assert {"name", "host", "status", "changed", "detail"} <= set(s)
        assert "diff" in s or "commands" in s
        assert s["status"] in ("ok", "drift", "fixed", "failed", "skipped")
        assert isinstance(s["changed"], bool)
    assert doc["steps"][0]["commands"] == [["sysctl", "-w", "kernel.numa_balancing=0"]]


def test_skipped_without_block_is_ok():
    r = RunReport("ct200", "apply")
    from gpubox.steps import StepResult

    r.steps.append(StepResult("bench", "ct200", "skipped", detail="--no-bench"))
    assert not r.ok and r.exit_code == 1  # nothing was checked: skipped alone is not ok
    r.steps.insert(0, StepResult("numa-balancing", "pve1", "ok"))
    assert r.ok and r.exit_code == 0 and r.recap()["skipped"] == 1


def test_emit_json_and_exit_status(ctx, capsys):
    drift = run_steps(ctx, [KnobStep()], "check")
    with pytest.raises(SystemExit) as ei:
        emit(drift, as_json=True)
    assert ei.value.code == 1 and json.loads(capsys.readouterr().out)["steps"][0]["status"] == "drift"
    fixed = run_steps(ctx, [KnobStep()], "apply")
    with pytest.raises(SystemExit) as ei:
        emit(fixed, as_json=False)
    out = capsys.readouterr().out
    assert ei.value.code == 0 and "fixed" in out and "ct200: ok" in out and "changed:" in out


def test_table_shows_cause_repair_and_commands(ctx, capsys):
    r = run_steps(ctx, [KnobStep()], "plan")
    render_report(r, console())
    out = capsys.readouterr().out
    assert "would change" in out and "$ sysctl -w kernel.numa_balancing=0" in out
    assert "cause: reset by the reboot" in out and "repair: write 0" in out
    assert "problems remain" in out
