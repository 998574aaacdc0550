"""The report as data: findings first, then tables, verdicts and the appendix of box facts.

Renderers (latex, markdown, html) only lay this out; every number and sentence is decided here
or in findings/tables, so the three formats say the same thing.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from ..result_model import Tool
from . import tables as T
from .data import ResultDoc
from .observations import Observation, observations

NOT_RECORDED = "not recorded"


@dataclass
class Appendix:
    run: str
    facts: list[tuple[str, str]]
    gpus: T.Table | None
    servers: list[dict]


@dataclass
class Report:
    title: str
    runs: list[ResultDoc]
    compare: bool
    findings: list[Observation]
    tables: list[T.Table]
    comparisons: list[T.Table]
    verdicts: list[dict]
    appendices: list[Appendix] = field(default_factory=list)
    advice: list = field(default_factory=list)  # advise.Advice per run: the report leads with it

    @property
    def finding_groups(self) -> list[tuple[str | None, list[Observation]]]:
        """Comparison findings first, then one group per run (no headings for a single run)."""
        if len(self.runs) == 1:
            return [(None, self.findings)] if self.findings else []
        groups = []
        comp = [f for f in self.findings if f.id == "before_after"]
        if comp:
            groups.append(("Comparison", comp))
        for r in self.runs:
            fs = [f for f in self.findings if f.run == r.name and f.id != "before_after"]
            if fs:
                groups.append((r.name, fs))
        return groups

    def to_dict(self) -> dict:
        return {
            "title": self.title,
            "runs": [
                {"name": r.name, "path": r.path, "box": r.box, "run_id": r.result.run_id or None}
                for r in self.runs
            ],
            "findings": [f.to_dict() for f in self.findings],
            "tables": [t.to_dict() for t in self.tables],
            "comparisons": [t.to_dict() for t in self.comparisons],
            "verdicts": self.verdicts,
            "advice": [a.to_dict() for a in self.advice],
        }


def _s(v) -> str:
    if v is None or v == "" or v == {} or v == []:
        return NOT_RECORDED
    return str(v)


def appendix(run: ResultDoc) -> Appendix:
    f = run.facts
    mrrs = f.pcie_mrrs
    if isinstance(mrrs, dict) and mrrs:
        vals = sorted(set(map(str, mrrs.values())))
        mrrs_txt = (
            f"{vals[0]} bytes on all {len(mrrs)} GPUs"
            if len(vals) == 1
            else ", ".join(f"{k}: {v}" for k, v in mrrs.items())
        )
    else:
        mrrs_txt = NOT_RECORDED
    env = f.nccl_env
    env_txt = (
        " ".join(f"{k}={v}" for k, v in env.items())
        if isinstance(env, dict) and env
        else ("none set" if isinstance(env, dict) else NOT_RECORDED)
    )
    nb = f.numa_balancing
    nb_txt = (
        {0: "0 (off)", 1: "1 (on)", 2: "2 (memory tiering)"}.get(nb, _s(nb))
        if nb is not None
        else NOT_RECORDED
    )
    res = run.result
    tool = res.tool or Tool()
    facts = [
        ("box", run.box),
        ("run", _s(res.run_id)),
        ("file", run.path),
        ("started / finished", f"{_s(res.started_at)} / {_s(res.finished_at)}"),
        ("profile", _s(res.profile)),
        ("simulated server", "yes" if res.simulated else "no"),
        ("driver", _s(f.driver)),
        ("engine", _s(f.engine)),
        ("model", _s(f.model)),
        ("drafter", _s(f.drafter)),
        ("NCCL profile", _s(f.nccl_profile)),
        ("NCCL env", env_txt),
        ("PCIe MaxReadReq", mrrs_txt),
        ("NUMA balancing", nb_txt),
        ("gpubox", f"{_s(tool.version)} ({_s(tool.git)})"),
    ]
    # what `gpubox recover` changed before this measurement, one row per repair, with the values
    # it set and the commands it ran (the result's optional `repairs`, written by recover)
    for r in res.repair_list():
        cmds = r.commands if isinstance(r.commands, list) else []
        ran = "; ".join(" ".join(map(str, c)) for c in cmds if isinstance(c, list))
        facts.append(
            (
                f"repair: {_s(r.step)} ({_s(r.host)})",
                _s(r.detail) + (f"; ran: {ran}" if ran else ""),
            )
        )
    gpus = f.gpu_list()
    gt = None
    if gpus:
        gt = T.Table(f"gpus_{run.name}", "GPUs", ["#", "name", "bus id", "NUMA", "link", "memory MiB"])
        for g in gpus:
            numa = g.numa_node
            gt.rows.append(
                [
                    T.Cell.label(_s(g.index)),
                    T.Cell.label(_s(g.name)),
                    T.Cell.label(_s(g.bus_id)),
                    T.Cell.label("unknown" if not isinstance(numa, int) or numa < 0 else str(numa)),
                    T.Cell.label(_s(g.link)),
                    T.Cell.label(_s(g.memory_mib)),
                ]
            )
    servers = []
    for s in run.servers:
        cmd = s.command
        senv = s.env if isinstance(s.env, dict) else {}
        servers.append(
            {
                "title": f"TP{s.tp} {s.label}",
                "status": _s(s.status),
                "error": s.error,
                "gpus": ",".join(map(str, s.gpus or [])) or NOT_RECORDED,
                "command": shlex.join(map(str, cmd)) if isinstance(cmd, list) else _s(cmd),
                "env": " ".join(f"{k}={shlex.quote(str(v))}" for k, v in senv.items()),
                "startup_s": s.startup_s,
            }
        )
    return Appendix(run.name, facts, gt, servers)


def verdict(run: ResultDoc) -> dict:
    v = run.verdict
    return {
        "run": run.name,
        "box": run.box,
        "status": _s(v.status),
        "reasons": [{"level": _s(r.level), "message": _s(r.message), "key": r.key} for r in v.reasons or []],
    }


def build(
    runs: list[ResultDoc], compare: bool = False, title: str | None = None, advice: list | None = None
) -> Report:
    """The report; `advice` (advise.Advice per run) is computed from the runs alone when not given."""
    from .advice import advise_all

    boxes = list(dict.fromkeys(r.box for r in runs))
    title = title or ("Benchmark report: " + ", ".join(boxes))
    comps = []
    if compare:
        comps = [t for t in (T.comparison(runs[0], r) for r in runs[1:]) if t is not None]
    return Report(
        title=title,
        runs=runs,
        compare=compare,
        findings=observations(runs, compare),
        tables=T.all_tables(runs),
        comparisons=comps,
        verdicts=[verdict(r) for r in runs],
        appendices=[appendix(r) for r in runs],
        advice=advise_all(runs[1:] if compare else runs) if advice is None else advice,
    )
