"""The lane/DAG runner: order, overlap between lanes, blocking in apply mode, deadlock refusal."""

import threading
import time

import pytest

from gpubox.pipeline import Node, run_pipeline
from gpubox.steps import Action, Finding, Plan, Step


class Box:
    name = "bx"


class Ctx:
    box = None
    verbose = False
    host = container = None  # the actions here touch no host


class Rec(Step):
    """A step whose state is a flag in a shared dict; records start/end times."""

    def __init__(self, name, where, world, log, *, broken=False, sleep=0.0, unfixable=False, meet=None):
        self.name, self.where, self.world, self.log = name, where, world, log
        self.broken, self.sleep, self.unfixable = broken, sleep, unfixable
        self.meet = meet  # a threading.Barrier the step waits at inside its check

    def host_name(self, ctx):
        return self.where

    def check(self, ctx):
        self.log.append(("check", self.name, time.monotonic()))
        if self.sleep:
            time.sleep(self.sleep)
        if self.meet is not None:
            try:
                self.meet.wait()
            except threading.BrokenBarrierError:
                self.log.append(("alone", self.name, time.monotonic()))
        self.log.append(("checked", self.name, time.monotonic()))
        if self.world.get(self.name) or not self.broken:
            return Finding.ok("fine")
        return Finding.drift("broken", cause="test", repair="fix")

    def plan(self, ctx, f):
        return Plan("fix it", actions=[Fix(self)])


class Fix(Action):
    """Sets the step's flag in the shared world (unless the step is unfixable)."""

    def __init__(self, step):
        self.step = step

    def describe(self, host):
        return [["fix", self.step.name]]

    def execute(self, run):
        if not self.step.unfixable:
            self.step.world[self.step.name] = True


def test_lanes_overlap_and_respect_requires():
    world, log = {}, []
    # a and b meet inside their checks: only lanes that really run at once get past the barrier
    # (run one after the other, the first waits out the barrier's timeout alone); no time budget
    meet = threading.Barrier(2, timeout=30)
    a = Rec("a", "host", world, log, meet=meet)
    b = Rec("b", "container", world, log, meet=meet)
    c = Rec("c", "container", world, log)
    nodes = [Node(a, (), "host"), Node(b, (), "container"), Node(c, ("a",), "container")]
    rep = run_pipeline(Ctx(), nodes, "check")
    assert [s.name for s in rep.steps] == ["a", "b", "c"]
    start = {n: t for v, n, t in log if v == "check"}
    end = {n: t for v, n, t in log if v == "checked"}
    assert not [n for v, n, _ in log if v == "alone"], "lanes a and b should have run at the same time"
    assert start["b"] < end["a"] and start["a"] < end["b"]
    assert start["c"] >= end["a"]  # c waited for a


def test_apply_blocks_dependents_of_unfixable_step():
    world, log = {}, []
    a = Rec("a", "host", world, log, broken=True, unfixable=True)
    b = Rec("b", "container", world, log, broken=True)
    c = Rec("c", "container", world, log, broken=True)
    rep = run_pipeline(
        Ctx(), [Node(a, (), "host"), Node(b, ("a",), "container"), Node(c, (), "container")], "apply"
    )
    st = {s.name: s for s in rep.steps}
    assert st["a"].status == "failed"
    assert st["b"].status == "skipped" and st["b"].evidence["blocked_by"] == ["a"]
    assert st["c"].status == "fixed" and st["c"].changed
    assert not rep.ok and rep.exit_code == 1
    assert "b" not in world


def test_second_apply_changes_nothing():
    world, log = {}, []
    mk = lambda: [
        Node(Rec("a", "host", world, log, broken=True), (), "host"),
        Node(Rec("b", "container", world, log, broken=True), ("a",), "container"),
    ]
    first = run_pipeline(Ctx(), mk(), "apply")
    assert first.changed and first.ok
    second = run_pipeline(Ctx(), mk(), "apply")
    assert not second.changed and second.ok
    assert all(s.status == "ok" for s in second.steps)


def test_plan_mode_changes_nothing_and_lists_commands():
    world, log = {}, []
    rep = run_pipeline(Ctx(), [Node(Rec("a", "host", world, log, broken=True), (), "host")], "plan")
    assert world == {}
    assert rep.steps[0].status == "drift" and rep.steps[0].commands == [["fix", "a"]]


def test_contradictory_order_is_refused():
    world, log = {}, []
    a = Rec("a", "host", world, log)
    b = Rec("b", "host", world, log)
    with pytest.raises(ValueError, match="deadlock"):
        run_pipeline(Ctx(), [Node(a, ("b",), "host"), Node(b, (), "host")], "check")


def test_transport_error_aborts_the_run():
    from gpubox.errors import TransportError

    class Down(Step):
        name, where = "down", "host"

        def check(self, ctx):
            raise TransportError("pve1: cannot reach 10.0.0.1:22: timed out")

    world, log = {}, []
    with pytest.raises(TransportError):
        run_pipeline(
            Ctx(),
            [Node(Down(), (), "host"), Node(Rec("b", "container", world, log), (), "container")],
            "check",
        )


def test_bench_headline_quotes_decode_figures_per_tp():
    from gpubox.provision.recover import headline

    ms = [
        {"workload": "decode", "status": "ok", "output_len": 1024, "tp": tp, "label": lab, "tok_s": v}
        for tp, lab, v in [
            (1, "auto", 26.6),
            (4, "auto", 37.8),
            (1, "ddtree:15", 173.4),
            (4, "ddtree:15", 281.1),
        ]
    ]
    ms.append(
        {
            "workload": "decode",
            "status": "failed",
            "output_len": 1024,
            "tp": 8,
            "label": "auto",
            "tok_s": None,
        }
    )
    assert headline({"measurements": ms}) == "decode@1024 tok/s TP1/4: auto 26.6/37.8, ddtree:15 173.4/281.1"
    assert headline({"measurements": []}) == "no decode measurement"
