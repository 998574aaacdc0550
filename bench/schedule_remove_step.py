"""The schedule-remove step: disable and delete the box's timer/cron entry and the .prom textfile
its checks wrote (`gpubox schedule remove`), as removals a dry run shows as diffs."""

from __future__ import annotations

from dataclasses import dataclass

from gpubox.diffs import unified
from gpubox.steps import Finding, Plan, Remove, Run

from .schedule import (
    UNIT_DIR,
    TargetExists,
    TargetText,
)
from .schedule_step import Evidence, Options, SpecStep, runs_systemd


class RemoveFile(Remove):
    """A removal shown as git shows a deleted file (+++ /dev/null), as `schedule remove` always has."""

    def diff(self) -> str:
        return unified(self.path, self.old, None)


@dataclass
class RemoveFacts:
    present: dict[str, str]  # the schedule's files there (units and cron line) and their text
    systemd: bool = False  # the target runs systemd (read only when units are present)
    # the node_exporter textfile the checks wrote: (where, path, text), None when absent. Left
    # behind, node_exporter would export the last verdict ("healthy") for ever.
    prom: tuple[str, str, str] | None = None


def prom_file(box) -> tuple[str, str]:
    """(where, path) of the box's .prom textfile, as run-once writes it (bench.runonce)."""
    from . import prom

    where = str(box.var("gpubox_prometheus_on", "container"))
    return where, prom.textfile_path(box.name, box.var("gpubox_prometheus_textfile_dir", prom.DEFAULT_DIR))


class ScheduleRemoveStep(SpecStep):
    """Disable and delete the box's timer/cron entry."""

    name = "schedule-remove"
    title = "remove scheduled health check"
    where = "container"

    def gather(self, ctx) -> RemoveFacts:
        s = self.spec
        paths = [f"{UNIT_DIR}/{s.service}", f"{UNIT_DIR}/{s.timer}", s.cron_file]
        present = {p: ctx.fact(TargetText, s.on, p) for p in paths if ctx.fact(TargetExists, s.on, p)}
        units = any(p.startswith(UNIT_DIR) for p in present)
        where, path = prom_file(ctx.box)
        prom = (
            (where, path, ctx.fact(TargetText, where, path) or "")
            if ctx.fact(TargetExists, where, path)
            else None
        )
        return RemoveFacts({p: t or "" for p, t in present.items()}, units and runs_systemd(ctx, s), prom)

    def decide(self, facts: RemoveFacts, opts: Options) -> Finding:
        s = opts.spec
        present = list(facts.present)
        if not present and facts.prom is None:
            return Finding.ok("no scheduled health check installed", evidence=Evidence(files=[]))
        units = [p for p in present if p.startswith(UNIT_DIR)]
        removes = [RemoveFile(p, old=facts.present[p]) for p in present]
        if facts.prom is not None:
            where, path, text = facts.prom
            removes.append(RemoveFile(path, old=text, where=where))
            present.append(path)
        if units and facts.systemd:
            actions = [
                Run(["systemctl", "disable", "--now", s.timer], timeout=60),
                *removes,
                Run(["systemctl", "daemon-reload"], timeout=60),
            ]
            desc = f"disable {s.timer} and delete {len(present)} file(s)"
        else:
            actions, desc = list(removes), f"delete {', '.join(present)}"
        return Finding.drift(
            f"installed: {', '.join(present)}",
            plan=Plan(desc, actions=actions),
            evidence=Evidence(files=present),
        )
