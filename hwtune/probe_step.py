"""The GPU probe as a doctor/recover step ("gpu-probe", checks only) and the code that runs the
probe script in a box's container.

The probe script (hwtune/probe.py) is sent to the container's interpreter on stdin
(`python3 - ARGS`), so it needs no gpubox install there: only the server's venv, which has torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.steps import FAILED, OK, SKIPPED, Finding, Step

from . import probe as probe_script
from .probe_verdict import gpu_table, judge, limits, parse, summarize, tp_sets


def box_limits(box) -> dict[str, Any]:
    """The box's `gpubox_probe` limits, with the all-reduce sets taken from its TP sizes."""
    lim = limits(box.var("gpubox_probe"))
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


def run_remote(host, lim: dict[str, Any], *, quick: bool, bandwidth: bool, p2p: bool = True,
               p2p_pairs=None) -> dict:
    """Run the probe on `host` (a gpubox Host, normally the container) and return its document."""
    script = Path(probe_script.__file__).read_text()
    argv = [lim["python"], "-", *probe_args(quick=quick, bandwidth=bandwidth, p2p=p2p, sets=lim["allreduce_sets"],
                                           p2p_pairs=p2p_pairs)]
    r = host.run(argv, input=script, timeout=float(lim["timeout_s"]))
    if r.rc == 127:
        raise GpuboxError(f"{lim['python']} not found on {host.name}",
                          "set gpubox_probe.python to the server venv's interpreter, e.g. /opt/vllm/bin/python3")
    if r.rc != 0:
        tail = (r.stderr or r.stdout or "").strip().splitlines()[-1:] or [""]
        raise GpuboxError(f"the probe exited {r.rc} on {host.name}: {tail[0][:200]}",
                          "run `gpubox -v probe BOX`, or the script by hand: python3 hwtune/probe.py")
    return parse(r.stdout, source=f"the probe on {host.name}")


class GpuProbe(Step):
    """Read-only: NVML facts and copy bandwidth against the box's limits. Nothing to apply: a slow
    link or a pending row remap needs hands on the machine, so problems end as `failed` with the
    cause and the repair, and apply mode never tries to "fix" them."""

    name = "gpu-probe"
    title = "GPU health probe (NVML, PCIe link, bandwidth)"
    where = "container"
    requires = ("cuda",)

    def check(self, ctx) -> Finding:
        lim = box_limits(ctx.box)
        doc = run_remote(ctx.container, lim, quick=not ctx.opt("full_probe", False),
                         bandwidth=not ctx.opt("no_bandwidth", False))
        checks = judge(doc, lim, expect_gpus=_int(ctx.box.var("gpubox_gpus")))
        status, detail, ev = summarize(checks)
        ev.update(gpus=gpu_table(doc, lim), checks=[{"name": c.name, "status": c.status, "detail": c.detail}
                                                    for c in checks])
        if status == OK:
            return Finding.ok(detail, **ev)
        if status == SKIPPED:
            if ctx.box.var("gpubox_simulated"):  # say plainly that the sim has no GPU to probe
                detail = f"simulated box, no GPU to probe: {detail}"
            return Finding(SKIPPED, detail, ev)
        bad = [c for c in checks if c.status not in (OK, SKIPPED)]
        return Finding(FAILED, detail, ev, cause=bad[0].cause, repair=bad[0].repair)


def steps(ctx) -> list[Step]:
    return [GpuProbe()]
