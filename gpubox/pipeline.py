"""Run steps as a small DAG in lanes: one lane per place a step acts on (the Proxmox host, the
container), steps of a lane in order, lanes in parallel. That lets staging inside the container
overlap with tuning on the host while a step never starts before the steps it requires.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .errors import TransportError
from .steps import FIXED, OK, SKIPPED, RunReport, Step, StepResult, run_step


@dataclass
class Node:
    step: Step
    requires: tuple[str, ...] = ()
    lane: str = "host"

    @property
    def name(self) -> str:
        return self.step.name


@dataclass
class _Shared:
    results: dict[str, StepResult] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    error: BaseException | None = None


def _check_order(nodes: list[Node]) -> None:
    """Refuse a graph whose lane order contradicts its requirements (it would deadlock)."""
    names = {n.name for n in nodes}
    done: set[str] = set()
    lanes: dict[str, list[Node]] = {}
    for n in nodes:
        lanes.setdefault(n.lane, []).append(n)
    heads = {lane: 0 for lane in lanes}
    while len(done) < len(nodes):
        progressed = False
        for lane, seq in lanes.items():
            i = heads[lane]
            if i < len(seq) and all(r in done or r not in names for r in seq[i].requires):
                done.add(seq[i].name)
                heads[lane] += 1
                progressed = True
        if not progressed:
            stuck = [seq[heads[l]].name for l, seq in lanes.items() if heads[l] < len(seq)]
            raise ValueError(f"pipeline order deadlocks at {stuck}")


def run_pipeline(ctx, nodes: Iterable[Node], mode: str = "check", *,
                 on_start: Callable[[Node], None] | None = None,
                 on_result: Callable[[StepResult], None] | None = None,
                 parallel: bool = True) -> RunReport:
    """Run nodes lane by lane; in apply mode a node whose requirement did not end ok/fixed is skipped."""
    from .boxlock import lock_for
    with lock_for(ctx, mode):       # every change to a box holds its one lock
        return _run_pipeline(ctx, nodes, mode, on_start, on_result, parallel)


def _run_pipeline(ctx, nodes, mode, on_start, on_result, parallel) -> RunReport:
    nodes = list(nodes)
    _check_order(nodes)
    names = {n.name for n in nodes}
    shared = _Shared()
    t0 = time.monotonic()

    def run_lane(seq: list[Node]) -> None:
        for node in seq:
            reqs = [r for r in node.requires if r in names]
            with shared.cond:
                shared.cond.wait_for(lambda: shared.error is not None or all(r in shared.results for r in reqs))
                if shared.error is not None:
                    return
                bad = [r for r in reqs if shared.results[r].status not in (OK, FIXED)]
            if mode == "apply" and bad:
                res = StepResult(node.name, node.step.host_name(ctx), SKIPPED, title=node.step.title or node.name,
                                 detail=f"blocked: {', '.join(bad)} did not end ok",
                                 evidence={"blocked_by": bad}, repair=f"fix {', '.join(bad)} first, then re-run")
            else:
                if on_start:
                    on_start(node)
                try:
                    res = run_step(node.step, ctx, mode)
                except BaseException as exc:  # transport errors end the whole run (exit 2)
                    with shared.cond:
                        shared.error = exc
                        shared.cond.notify_all()
                    return
            with shared.cond:
                shared.results[node.name] = res
                shared.cond.notify_all()
            if on_result:
                on_result(res)

    lanes: dict[str, list[Node]] = {}
    for n in nodes:
        lanes.setdefault(n.lane, []).append(n)
    if parallel and len(lanes) > 1:
        threads = [threading.Thread(target=run_lane, args=(seq,), name=f"lane-{lane}", daemon=True)
                   for lane, seq in lanes.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        # Sequential: walk the global order (which _check_order proved consistent).
        for n in nodes:
            run_lane([n])
    if shared.error is not None:
        if isinstance(shared.error, TransportError):
            raise shared.error
        raise shared.error
    report = RunReport(box=getattr(getattr(ctx, "box", None), "name", "-"), mode=mode)
    report.steps = [shared.results[n.name] for n in nodes if n.name in shared.results]
    report.seconds = time.monotonic() - t0
    return report
