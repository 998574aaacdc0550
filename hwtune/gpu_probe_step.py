"""The GPU probe as a doctor/recover step ("gpu-probe", checks only) and the code that runs the
probe script in a box's container.

The probe script (hwtune/probe.py) runs as a payload (gpubox.transport.payload) with the
container's interpreter, so it needs no gpubox install there: only the server's venv, which has torch.
Its document is the step's one fact (`ProbeReport`, read as probe_doc.ProbeDoc); the verdict
(hwtune/probe_verdict.py) is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.facts import Fact
from gpubox.steps import FAILED, OK, OMIT, SKIPPED, Finding, Omit, Step
from gpubox.transport import payload

from . import probe as probe_script
from .probe_doc import ProbeDoc, parse
from .probe_verdict import decide, gpu_table, limits, summarize, tp_sets


def box_limits(box) -> dict[str, Any]:
    """The box's `gpubox_probe` limits, with the all-reduce sets taken from its TP sizes and the
    deliberate power cap (`gpubox_expected_power_limit`, watts; checked by gpubox.invschema)."""
    lim = limits(box.var("gpubox_probe"))
    watts = box.var("gpubox_expected_power_limit")
    if watts is not None:
        lim["expected_power_w"] = float(watts)
    if lim["allreduce_sets"] is None:
        bench = box.var("gpubox_bench") or {}
        sets = tp_sets(bench.get("tp") if isinstance(bench, dict) else None, _int(box.var("gpubox_gpus")))
        if sets is not None:
            lim["allreduce_sets"] = sets
    return lim


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def probe_args(*, quick: bool, bandwidth: bool, p2p: bool = True, sets=None, p2p_pairs=None) -> list[str]:
    args = []
    if quick:
        args.append("--quick")
    if not bandwidth:
        args.append("--no-bandwidth")
    if not p2p:
        args.append("--no-p2p")
    if sets is not None:
        args += ["--allreduce-sets", ";".join(",".join(map(str, s)) for s in sets)]
    if p2p_pairs is not None:
        args += ["--p2p-pairs", ",".join(f"{a}-{b}" for a, b in p2p_pairs)]
    return args


@dataclass(frozen=True)
class ProbeAnswer:
    """What the probe's run answered, and on which host (for the messages)."""

    host: str
    rc: int
    stdout: str
    stderr: str


class ProbeReport(Fact):
    """The probe's document from the container: the probe's payload run by `python` with `args`."""

    where = "container"

    @staticmethod
    def read(host, python: str, args: tuple[str, ...] = (), timeout: float = 600) -> ProbeAnswer:
        r = payload.run(host, probe_script.__name__, args, python=python, timeout=float(timeout))
        return ProbeAnswer(host.name, r.rc, r.stdout, r.stderr)

    @staticmethod
    def parse(raw: ProbeAnswer, python: str, args: tuple[str, ...] = (), timeout: float = 600) -> ProbeDoc:
        if raw.rc == 127:
            raise GpuboxError(
                f"{python} not found on {raw.host}",
                "set gpubox_probe.python to the server venv's interpreter, e.g. /opt/vllm/bin/python3",
            )
        if raw.rc != 0:
            tail = (raw.stderr or raw.stdout or "").strip().splitlines()[-1:] or [""]
            raise GpuboxError(
                f"the probe exited {raw.rc} on {raw.host}: {tail[0][:200]}",
                "run `gpubox -v probe BOX`, or the script by hand: python3 hwtune/probe.py",
            )
        return parse(raw.stdout, source=f"the probe on {raw.host}")


def _report_args(
    lim: dict[str, Any], *, quick: bool, bandwidth: bool, p2p: bool = True, p2p_pairs=None
) -> tuple[str, tuple[str, ...], float]:
    args = probe_args(
        quick=quick, bandwidth=bandwidth, p2p=p2p, sets=lim["allreduce_sets"], p2p_pairs=p2p_pairs
    )
    return lim["python"], tuple(args), float(lim["timeout_s"])


def run_remote(
    host, lim: dict[str, Any], *, quick: bool, bandwidth: bool, p2p: bool = True, p2p_pairs=None
) -> dict:
    """Run the probe on `host` (a gpubox Host, normally the container) and return its document as
    JSON (checked against probe_doc.ProbeDoc on the way), as the CLI prints it."""
    args = _report_args(lim, quick=quick, bandwidth=bandwidth, p2p=p2p, p2p_pairs=p2p_pairs)
    return ProbeReport.parse(ProbeReport.read(host, *args), *args).to_json()


@dataclass
class ProbeOptions:
    limits: dict[str, Any] = field(default_factory=dict)  # the box's gpubox_probe over DEFAULTS
    quick: bool = True
    bandwidth: bool = True
    expect_gpus: int | None = None
    simulated: bool = False


@dataclass
class ProbeFacts:
    doc: ProbeDoc = field(default_factory=ProbeDoc)  # the probe's gpubox.probe/1 document


@dataclass
class ProbeEvidence:
    problems: list[str] | Omit = OMIT  # failed/drift: the checks that are not ok
    skipped: list[str] | Omit = OMIT  # ok: the checks that had nothing to measure
    gpus: list[dict[str, object]] = field(default_factory=list)  # probe_verdict.gpu_table's rows
    checks: list[dict[str, str]] = field(default_factory=list)  # name, status, detail of each check


class GpuProbeStep(Step):
    """Read-only: NVML facts and copy bandwidth against the box's limits. Nothing to apply: a slow
    link or a pending row remap needs hands on the machine, so problems end as `failed` with the
    cause and the repair, and apply mode never tries to "fix" them."""

    name = "gpu-probe"
    title = "GPU health probe (NVML, PCIe link, bandwidth)"
    where = "container"
    requires = ("cuda",)

    def options(self, ctx) -> ProbeOptions:
        return ProbeOptions(
            box_limits(ctx.box),
            quick=not ctx.opt("full_probe", False),
            bandwidth=not ctx.opt("no_bandwidth", False),
            expect_gpus=_int(ctx.box.var("gpubox_gpus")),
            simulated=bool(ctx.box.var("gpubox_simulated")),
        )

    def gather(self, ctx) -> ProbeFacts:
        o = self.options(ctx)
        args = _report_args(o.limits, quick=o.quick, bandwidth=o.bandwidth)
        return ProbeFacts(ctx.fact(ProbeReport, *args))

    def decide(self, facts: ProbeFacts, opts: ProbeOptions) -> Finding:
        lim = {**limits(), **opts.limits}
        checks = decide(facts.doc, lim, expect_gpus=opts.expect_gpus)
        status, detail, summary = summarize(checks)
        ev = ProbeEvidence(
            summary.get("problems", OMIT),
            summary.get("skipped", OMIT),
            gpu_table(facts.doc, lim),
            [{"name": c.name, "status": c.status, "detail": c.detail} for c in checks],
        )
        if status == OK:
            return Finding.ok(detail, evidence=ev)
        if status == SKIPPED:
            if opts.simulated:  # say plainly that the sim has no GPU to probe
                detail = f"simulated box, no GPU to probe: {detail}"
            return Finding(SKIPPED, detail, ev)
        bad = [c for c in checks if c.status not in (OK, SKIPPED)]
        return Finding(FAILED, detail, ev, cause=bad[0].cause, repair=bad[0].repair)


def steps(ctx) -> list[Step]:
    return [GpuProbeStep()]
