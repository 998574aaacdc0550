"""The measuring loop of a benchmark: launch the server at each TP x method, measure the
profile's workloads against it, tear it down; and the facts about the box the result records.

`measure_box` runs here for a local container and inside the container (bench.remote) for one
reached over SSH or `pct exec`; bench.runner wraps it with the verdict, the result file and the
history. Both import this module, neither imports the other's caller (no import cycle).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Callable

from gpubox.errors import GpuboxError

from . import results
from .client import Client
from .gpus import box_topology
from .launcher import LaunchError, Server, build_command, nccl_env, parse_method, spec_from_box
from .profiles import plan
from .workloads import RUNNERS, Point, not_run

Progress = Callable[[str], None]


def _progress(console, total: int):
    """A rich progress bar on the console (stderr), or a no-op when quiet/JSON."""
    if console is None:
        return None, (lambda desc, advance=True: None)
    if not console.is_terminal:
        # a pipe or a file: a bar would print nothing until the end (rich draws live only on a
        # terminal), so one plain line per measurement, as it happens
        done = [0]

        def line(desc: str, advance: bool = True) -> None:
            # announced (advance=False) as the measurement it starts; a bare advance ends it quietly
            if desc:
                n = max(1, min(done[0] + (0 if advance else 1), total))
                console.print(f"bench [{n}/{total}] {desc}", markup=False, highlight=False, soft_wrap=True)
            if advance:
                done[0] += 1

        return None, line
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = prog.add_task("bench", total=total)

    def step(desc: str, advance: bool = True) -> None:
        prog.update(task, description=desc, advance=1 if advance else 0)

    return prog, step


async def measure_server(
    url: str,
    *,
    tp: int,
    label: str,
    points: list[tuple[str, dict]],
    prof: dict[str, Any],
    timeout: float,
    alive: Callable[[], bool] = lambda: True,
    on_point: Callable[[str, bool], None] = lambda d, a=True: None,
    died: Callable[[], str] | None = None,
    tokenizer_dir: str | None = None,
    learned: dict[str, Any] | None = None,
    model: str | None = None,
    fallback_model: str | None = None,
) -> list[dict[str, Any]]:
    """Every workload point against one running server; never raises for a failing server.

    `learned` receives what the client found out about the server (how prompts were sized, which
    sampling fields it rejected, where output tokens came from) for the result document."""
    method, budget, label = parse_method(label) if label != "custom" else ("custom", None, "custom")
    p = Point(
        tp,
        method,
        budget,
        label,
        int(prof.get("warmup", 1)),
        int(prof.get("repetitions", 3)),
        int(prof.get("prompt_tokens", 128)),
        metrics_url=url,
        deadline_s=float(prof.get("request_deadline_s", max(timeout * 8, 60.0))),
    )
    out: list[dict[str, Any]] = []
    dead_reason: str | None = None
    from .sizing import LocalTokenizer

    async with Client(
        url,
        timeout=timeout,
        phase_timeout=min(30.0, timeout),
        tokenizer=LocalTokenizer.load(tokenizer_dir),
        model=model,
        fallback_model=fallback_model,
    ) as c:
        for kind, kw in points:
            on_point(f"TP{tp} {label} {kind} {next(iter(kw.values()))}", False)
            if dead_reason:
                out.append(not_run(tp, method, budget, label, kind, kw, "failed", dead_reason, p.reps))
                on_point("", True)
                continue
            try:
                m = await RUNNERS[kind](c, p, **kw)
            except GpuboxError as exc:
                m = not_run(tp, method, budget, label, kind, kw, "failed", str(exc), p.reps)
            except Exception as exc:  # any surprise fails this measurement, never the run (issue 16)
                why = " ".join(str(exc).split())[:200]
                m = not_run(
                    tp, method, budget, label, kind, kw, "failed", f"{type(exc).__name__}: {why}", p.reps
                )
            if not alive():
                dead_reason = died() if died else "the server died"
                if m["status"] == "failed":
                    m["reason"] = f"{m['reason']} ({dead_reason})"
            out.append(m)
            on_point("", True)
        if learned is not None:
            learned.update(
                {
                    "prompt_sizing": c.sizer.source if c.sizer else None,
                    "prompt_sizing_tried": c.sizer.tried if c.sizer else [],
                    "sampling_extras_accepted": c.extras_ok,
                    "notes": list(c.notes),
                }
            )
    return out


def box_facts(ctx, settings: dict[str, Any]) -> dict[str, Any]:
    """What the report appendix needs about the box as measured; absent facts are None, not guesses."""
    var = ctx.box.var
    facts: dict[str, Any] = {
        "gpus": [],
        "driver": None,
        "nccl_env": {},
        "nccl_profile": var("gpubox_nccl_profile"),
        "pcie_mrrs": {},
        "numa_balancing": None,
        "engine": settings.get("engine", "vllm"),
        "model": settings.get("model") or (var("gpubox_model", {}) or {}).get("dest"),
        "drafter": (settings.get("drafter") or (var("gpubox_drafter", {}) or {}).get("dest")),
    }
    try:
        td = box_topology(ctx).to_dict()  # the hwtune area's GPU facts (NVML, else sysfs, else inventory)
        facts["gpus"] = [
            {k: g.get(k) for k in ("index", "name", "bus_id", "numa_node", "link", "memory_mib")}
            for g in td["gpus"]
        ]
        facts["topology_source"] = td.get("source")
        facts["driver"] = td.get("driver")
    except GpuboxError:
        pass
    if not facts["gpus"]:
        facts["gpus"] = [{"index": i} for i in range(int(ctx.box.var("gpubox_gpus", 0) or 0))]
    try:
        ver = ctx.container.read_text("/proc/driver/nvidia/version", "")
        m = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", ver)
        facts["driver"] = facts["driver"] or (m.group(1) if m else None)
    except Exception:
        pass
    try:
        facts["numa_balancing"] = int(ctx.host.read_text("/proc/sys/kernel/numa_balancing", "").strip() or -1)
        if facts["numa_balancing"] < 0:
            facts["numa_balancing"] = None
    except Exception:
        pass
    try:
        facts["nccl_env"] = nccl_env(ctx)
    except GpuboxError:
        facts["nccl_env"] = {}
    facts["pcie_mrrs"] = _mrrs(ctx)
    return facts


def _mrrs(ctx) -> dict[str, int]:
    """MaxReadReq in bytes per GPU function, read back from config space as measured (what the
    report's appendix shows; {} where it cannot be read, e.g. no pciutils there)."""
    try:
        from gpubox.hwtune import pcie

        out = {}
        for st in pcie.read_states(ctx.host):
            if st.devctl is not None and st.kind == "gpu":
                out[st.bdf] = pcie.decode_devctl(st.devctl)["mrrs"]
        return out
    except Exception:  # a fact for the report only: never the reason a benchmark fails
        return {}


def measure_box(
    ctx,
    name: str,
    prof: dict[str, Any],
    tps: list[int],
    methods: list[str],
    settings: dict[str, Any],
    facts: dict[str, Any],
    log_root: Path,
    step: Callable[..., None] | None = None,
) -> dict[str, Any]:
    """Launch, measure and tear down each TP x method on this machine: the one measuring loop,
    run by `run_box` locally and by bench.remote inside the container. The document it returns
    has no verdict yet (`_finish` adds it where the history lives)."""
    doc = results.new_document(
        ctx.box.name,
        name,
        simulated=bool(settings.get("simulated")),
        sim_speed=settings.get("sim_speed"),
        facts=facts,
    )
    log_dir = Path(log_root) / doc["run_id"]
    points = plan(prof)
    timeout = float(settings.get("request_timeout", 120))
    ready_timeout = float(settings.get("ready_timeout", 900))
    prog = None
    if step is None:
        prog, step = _progress(ctx.console, len(tps) * len(methods) * len(points))
    if prog:
        prog.start()
    try:
        for tp in tps:
            for label in methods:
                spec = spec_from_box(ctx, label, tp, settings)
                argv, env = build_command(spec)
                rec = {
                    "tp": tp,
                    "method": spec.method,
                    "budget": spec.budget,
                    "label": spec.label,
                    "gpus": spec.gpus,
                    "command": argv,
                    "env": env,
                    "status": "ok",
                    "error": None,
                    "log_tail": None,
                    "startup_s": None,
                    "max_model_len": spec.max_model_len,
                    "log": str(log_dir / f"tp{tp}-{spec.label.replace(':', '-')}.log"),
                }
                doc["servers"].append(rec)
                server = Server(
                    argv, env, host=spec.host, port=spec.port, log_path=rec["log"], model=spec.model or None
                )
                step(f"TP{tp} {spec.label}: starting server", False)
                try:
                    server.start()
                    rec["startup_s"] = round(server.wait_ready(ready_timeout), 3)
                except LaunchError as exc:
                    server.stop()
                    rec.update(status="failed", error=exc.problem, log_tail=exc.log_tail)
                    for kind, kw in points:
                        doc["measurements"].append(
                            not_run(
                                tp,
                                spec.method,
                                spec.budget,
                                spec.label,
                                kind,
                                kw,
                                "failed",
                                f"server did not start: {exc.problem}",
                                int(prof.get("repetitions", 3)),
                            )
                        )
                        step("", True)
                    continue

                def died(server=server, rec=rec) -> str:
                    exc = server.crashed("during the run")
                    rec.update(status="failed", error=exc.problem, log_tail=exc.log_tail)
                    return f"server died: {exc.problem}"

                try:
                    rec["client"] = learned = {}
                    tok_dir = settings.get("tokenizer") or spec.model or None
                    ms = asyncio.run(
                        measure_server(
                            server.url,
                            tp=tp,
                            label=spec.label,
                            points=points,
                            prof=prof,
                            timeout=timeout,
                            alive=server.alive,
                            on_point=step,
                            died=died,
                            tokenizer_dir=tok_dir,
                            learned=learned,
                            model=settings.get("served_model"),
                            fallback_model=spec.model or None,
                        )
                    )
                    doc["measurements"] += ms
                    try:
                        import httpx

                        info = httpx.get(server.url + "/v1/models", timeout=2).json()["data"][0]
                        rec["max_model_len"] = info.get("max_model_len") or rec["max_model_len"]
                    except Exception:
                        pass
                finally:
                    server.stop()
    finally:
        if prog:
            prog.stop()
    return doc
