"""One action model (issue 25, point 2): every Plan is actions, a dry run shows what apply runs.

- every step registered in gpubox.areas.PIPELINE, on simulated boxes with faults that make each of
  them drift, plans only `Action` instances, and no step overrides the engine's verbs;
- what an action describes is what it executes: the argv lists a dry run shows are the argv lists
  the host then receives, in order, and no other changing command runs; the config commit writes
  its diff; the staging copy copies the files its dry-run listing names; the benchmark starts the
  server command lines it showed;
- the container restart asks for consent and does nothing without it.
"""

from __future__ import annotations

import importlib
import json

import pytest

from gpubox import areas
from gpubox.bench.bench_step import BenchRun, BenchStep
from gpubox.context import Context
from gpubox.diffs import unified
from gpubox.errors import GpuboxError
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.provision import container_config_step, container_step
from gpubox.provision.container_config_step import ConfigCommit
from gpubox.provision.container_step import ContainerRestart
from gpubox.provision.stage_step import StageCopy
from gpubox.simbox import build
from gpubox.steps import Action, Execution, Plan, Run, Step
from tests.layers_report import step_overrides

# faults that, together, make every pipeline step drift (the bench: no result yet)
FAULT_SETS = [
    ["uvm_missing", "uvm_stale_major", "mrrs_512", "numa_balancing", "nccl_missing", "shm_empty"],
    ["container_stopped", "truncated_shard", "nccl_misspelled", "link_degraded"],
    ["uvm_stale_major"],  # the live lxc-cgroup rule
    ["conf_devn_collision"],
]
# commands that change a box: each one that runs must be one a dry run showed
CHANGING = {"nvidia-modprobe", "lxc-cgroup", "sysctl", "systemctl", "udevadm"}


def _changes(argv: list[str]) -> bool:
    """Does this argv change the box? setpci only with a `REG=VALUE` operand (else it reads back)."""
    if argv[0] == "setpci":
        return any("=" in a for a in argv[argv.index("-s") + 2 :])
    return argv[0] in CHANGING or argv[:2] in (["pct", "start"], ["pct", "reboot"], ["pct", "stop"])


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))


def _ctx(sim, **opts):
    inv = Inventory(sim.inventory_path)
    return Context(box=inv.box(sim.box), inventory=inv, options={"persist": True, **opts})


def pipeline_steps(ctx) -> list[Step]:
    """Every registered pipeline step, as the areas give them (the bench unwrapped: recover runs it)."""
    return [st for mod in areas.PIPELINE for st in importlib.import_module(mod).steps(ctx)]


def _record_plans(monkeypatch) -> list[tuple[str, Plan]]:
    seen: list[tuple[str, Plan]] = []
    orig = Step.plan

    def plan(self, ctx, finding):
        p = orig(self, ctx, finding)
        seen.append((self.name, p))
        return p

    monkeypatch.setattr(Step, "plan", plan)
    return seen


def test_no_step_overrides_the_engine_verbs():
    assert step_overrides() == []


def test_a_plan_refuses_anything_but_actions():
    with pytest.raises(TypeError):
        Plan("x", [["rm", "-rf", "/"]])


@pytest.mark.parametrize("faults", FAULT_SETS, ids=lambda f: "+".join(f))
def test_every_pipeline_plan_is_actions(tmp_path, monkeypatch, faults):
    sim = build(tmp_path / "box", faults, gpus=8)
    seen = _record_plans(monkeypatch)
    ctx = _ctx(sim, bench_out=str(tmp_path / "out"))
    rep = run_steps(ctx, pipeline_steps(ctx), "plan")
    drifted = {s.name for s in rep.steps if s.status == "drift"}
    assert drifted and drifted == {name for name, _ in seen}  # every drift was planned
    for name, plan in seen:
        assert plan.actions, name
        assert all(isinstance(a, Action) for a in plan.actions), (name, plan.actions)


def test_the_plans_cover_every_pipeline_step(tmp_path, monkeypatch):
    names = set()
    for i, faults in enumerate(FAULT_SETS):
        sim = build(tmp_path / str(i), faults, gpus=8)
        seen = _record_plans(monkeypatch)
        ctx = _ctx(sim, bench_out=str(tmp_path / "out"))
        run_steps(ctx, pipeline_steps(ctx), "plan")
        names |= {n for n, _ in seen}
        monkeypatch.undo()
        monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    ctx = _ctx(build(tmp_path / "all"))
    every = {s.name for s in pipeline_steps(ctx)}
    # the steps that only report (no repair of their own, never drift) are all that is left
    reports_only = {
        "cuda",
        "gpu-probe",
        "pcie-link",
        "pcie-acs",
        "driver-packages",
        "kernel-log",
        "docker-toolkit",
        "shm-room",
    }
    assert every - names <= reports_only, every - names
    assert {"host-devices", "container-config", "container", "model-stage", "bench"} <= names


class _Recording:
    """Wraps a host: every argv it runs is recorded (and run as before)."""

    def __init__(self, host, log):
        self._host, self._log = host, log

    def run(self, argv, *a, **kw):
        self._log.append([str(x) for x in argv])
        return self._host.run(argv, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._host, name)


def _subsequence(shown, ran) -> bool:
    it = iter(ran)
    return all(any(r == s for r in it) for s in shown)


@pytest.mark.parametrize("faults", FAULT_SETS[:3], ids=lambda f: "+".join(f))
def test_apply_runs_exactly_the_argv_a_dry_run_shows(tmp_path, monkeypatch, faults):
    sim = build(tmp_path / "box", faults, gpus=8)
    ctx = _ctx(sim, yes=True)
    log: list[list[str]] = []
    per_step: dict[str, tuple[list, list]] = {}
    orig = Step.apply

    def apply(self, c, plan):
        start = len(log)
        host, cont = c.host, c.container
        c._hosts = (_Recording(host, log), _Recording(cont, log))
        try:
            orig(self, c, plan)
        finally:
            c._hosts = (host, cont)
        # the actions that show the argv they run (a staging copy shows `gpubox stage SRC DEST`, the
        # command that makes the same copy by hand: its file list is checked below)
        argv_actions = Plan(actions=[a for a in plan.actions if isinstance(a, (Run, ContainerRestart))])
        per_step[self.name] = (
            argv_actions.shown_commands(lambda where: self.host_for(c, where)),
            log[start:],
        )

    monkeypatch.setattr(Step, "apply", apply)
    steps = [s for s in pipeline_steps(ctx) if not s.measures]
    rep = run_steps(ctx, steps, "apply")
    status = {s.name: (s.status, s.detail) for s in rep.steps}
    assert per_step and all(status[n][0] == "fixed" for n in per_step), status
    for name, (shown, ran) in per_step.items():
        assert _subsequence(shown, ran), (name, shown, ran)
        changing = [r for r in ran if _changes(r)]
        assert all(r in shown for r in changing), (name, changing, shown)


def test_config_commit_writes_its_diff(tmp_path):
    sim = build(tmp_path / "box", ["uvm_stale_major"], gpus=2)
    ctx = _ctx(sim)
    f = container_config_step.ContainerConfigStep().check(ctx)
    commit = container_config_step.config_commit(f.plan)
    assert isinstance(commit, ConfigCommit) and commit.describe(ctx.host) == []
    path = sim.hpath("/etc/pve/lxc/200.conf")
    before = path.read_text()
    container_config_step.ContainerConfigStep().apply(ctx, f.plan)
    after = path.read_text()
    assert after == commit.text != before
    # the diff a dry run shows is the change made to the file (its main section)
    assert f.plan.diff == commit.diff() and commit.diff()
    full = unified("/etc/pve/lxc/200.conf", before, after)
    minus = {ln for ln in full.splitlines() if ln.startswith("-") and not ln.startswith("---")}
    plus = {ln for ln in full.splitlines() if ln.startswith("+") and not ln.startswith("+++")}
    shown = commit.diff().splitlines()
    assert minus <= set(shown) and plus <= set(shown)


def test_staging_copies_what_its_dry_run_lists(tmp_path):
    from gpubox.provision.stage_step import steps

    sim = build(tmp_path / "box", ["truncated_shard"])
    ctx = _ctx(sim)
    step = next(s for s in steps(ctx) if s.name == "model-stage")
    plan = step.plan(ctx, step.check(ctx))
    (copy,) = plan.actions
    assert isinstance(copy, StageCopy) and copy.describe(ctx.container) == [copy.argv]
    listed = sorted(ln[2:].split("  (")[0] for ln in copy.diff().splitlines())
    step.apply(ctx, plan)
    assert sorted(copy.copied["reasons"]) == listed and copy.copied["copied"] == len(listed)
    assert step.verify(ctx, plan).evidence.staged is copy.copied


def test_the_benchmark_starts_the_command_lines_it_showed(tmp_path):
    sim = build(tmp_path / "box")
    ctx = _ctx(sim, bench_out=str(tmp_path / "out"))
    ctx.box.container.vars["gpubox_bench"].update(tp=[1, 4], methods=["ddtree:15"])
    step = BenchStep()
    plan = step.plan(ctx, step.check(ctx))
    (bench,) = plan.actions
    assert isinstance(bench, BenchRun) and plan.description.endswith("(2 server launches)")
    shown = bench.describe(ctx.container)
    step.apply(ctx, plan)
    started = [
        [f"{k}={v}" for k, v in sorted(s["env"].items())] + list(s["command"]) for s in bench.doc["servers"]
    ]
    assert started == shown
    v = step.verify(ctx, plan)
    assert v.status == "ok" and v.evidence.run_id == bench.doc["run_id"]


class _Ctl:
    vmid = 200

    def __init__(self):
        self.acts: list[str] = []

    def act(self, action):
        self.acts.append(action)


class _Box:
    name = "ct200"


class _Ctx:
    box = _Box()

    class host:  # noqa: N801 - stands for the Proxmox host
        name = "pve"

    def __init__(self, **opts):
        self.options = opts

    def opt(self, key, default=None):
        v = self.options.get(key)
        return default if v is None else v


@pytest.fixture
def ctl(monkeypatch):
    c = _Ctl()
    cleared = []
    monkeypatch.setattr(container_step, "control", lambda ctx: c)
    monkeypatch.setattr(container_step, "clear_restart_due", lambda host, vmid: cleared.append((host, vmid)))
    c.cleared = cleared
    return c


def _execute(action, ctx):
    action.execute(Execution(lambda where: ctx.host, lambda h, p: None, ctx))


def test_restart_without_consent_does_nothing(ctl):
    asked = []
    r = ContainerRestart("reboot", 200, ["pct", "reboot", "200"], "auto")
    with pytest.raises(GpuboxError, match="not restarted without consent"):
        _execute(r, _Ctx(confirm=lambda q: asked.append(q) or False))
    assert asked == ["Restart CT 200 (ct200) now?"] and ctl.acts == [] and ctl.cleared == []
    with pytest.raises(GpuboxError, match="without consent"):  # no prompt at all (no terminal)
        _execute(r, _Ctx())
    assert ctl.acts == []


def test_restart_with_consent_runs_what_it_describes(ctl):
    r = ContainerRestart("reboot", 200, ["pct", "reboot", "200"], "auto")
    assert r.describe(None) == [["pct", "reboot", "200"]]
    _execute(r, _Ctx(confirm=lambda q: True))
    assert ctl.acts == ["reboot"] and ctl.cleared == [("pve", 200)]
    _execute(r, _Ctx(yes=True))  # --yes: no question
    assert ctl.acts == ["reboot", "reboot"]


def test_restart_never_refuses_and_names_the_command(ctl):
    r = ContainerRestart("start", 200, ["pct", "start", "200"], "never")
    with pytest.raises(GpuboxError) as e:
        _execute(r, _Ctx(yes=True))
    assert "--restart never" in e.value.problem and "`pct start 200`" in (e.value.fix or "")
    assert ctl.acts == []


def test_a_start_interrupts_nothing_and_asks_nothing(ctl):
    asked = []
    _execute(ContainerRestart("start", 200, ["pct", "start", "200"]), _Ctx(confirm=asked.append))
    assert ctl.acts == ["start"] and asked == []


def test_restart_through_pct_runs_its_described_argv(tmp_path):
    sim = build(tmp_path / "box", ["container_stopped"], gpus=2)
    ctx = _ctx(sim, yes=True)
    step = container_step.ContainerStep()
    plan = step.plan(ctx, step.check(ctx))
    (restart,) = plan.actions
    assert isinstance(restart, ContainerRestart)
    calls = len(sim.calls())
    step.apply(ctx, plan)
    ran = [[c["cmd"], *c["argv"]] for c in sim.calls()[calls:] if c["cmd"] == "pct"]
    assert [r for r in ran if r[1] != "status"] == restart.describe(ctx.host) == [["pct", "start", "200"]]
    assert step.verify(ctx, plan).status == "ok"


def test_unknown_restart_policy_is_bad_input_before_anything_is_read(tmp_path):
    sim = build(tmp_path / "box", ["container_stopped"], gpus=2)
    calls = len(sim.calls())
    ctx = _ctx(sim, restart="sometimes")
    with pytest.raises(GpuboxError, match="--restart 'sometimes' is not known"):
        run_steps(ctx, [container_step.ContainerStep()], "plan")
    assert len(sim.calls()) == calls


def test_run_describes_and_executes_the_same_argv():
    log = []

    class Host:
        name = "h"

        def path(self, p):
            return "/root" + p

        def run(self, argv, **kw):
            log.append(list(argv))

    from gpubox.steps import HostPath

    r = Run(["setpci", "-s", "0000:01:00.0", HostPath("/sys", "sysfs.path=")])
    h = Host()
    _execute_on(r, h)
    assert log == r.describe(h) == [["setpci", "-s", "0000:01:00.0", "sysfs.path=/root/sys"]]
    assert json.dumps(log)  # plain strings


def _execute_on(action, host):
    action.execute(Execution(lambda where: host, lambda h, p: None, None))
