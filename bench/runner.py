"""Run a benchmark: for each TP x method, launch the server, measure the profile's workloads, tear
down; then the verdict, the result document and the history entry.

`run_box(ctx, ...)` is what `gpubox bench BOX` and the recover pipeline's bench step call; it
measures here when the container is local and inside the container (bench.remote, the same
`measure_box` of bench.measure, re-exported here) when gpubox reaches it over SSH or `pct exec`.
`run_url(url, ...)` measures a server that is already running (`gpubox bench run --url`).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError

from . import results
from .client import Client, ModelNotNamed
from .launcher import parse_method

# re-exported: callers and tests import these from bench.runner; run_url uses _progress
from .measure import Progress, _progress, box_facts, measure_box, measure_server  # noqa: F401
from .profiles import plan, resolve_profile
from .verdict import decide


def server_identity(url: str, model: str | None) -> str:
    """A history name for a server measured by URL: host, port and model id, never one shared "url".

    Readable where it can be, plus a short hash of the exact URL and model so two servers whose
    names slug the same never share a baseline (issue 19: a 150 tok/s server was judged against
    another server's median)."""
    import hashlib
    from urllib.parse import urlsplit

    u = urlsplit(url)
    raw = f"{u.hostname or 'host'}-{u.port or ''}-{(model or 'model').rsplit('/', 1)[-1]}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.")[:60]
    h = hashlib.sha256(f"{url.rstrip('/')}|{model}".encode()).hexdigest()[:8]
    return f"url-{slug}-{h}"


def _finish(
    doc: dict[str, Any], expect: dict | None, box, out_dir, baseline=None, unrepaired: list[str] | None = None
) -> dict[str, Any]:
    """BOX: the inventory Box (its identity keys the history and the result file) or a name.
    UNREPAIRED: the box's problems left after a repair run ('not repaired: pcie-link: ...'): each is a
    degraded reason, so a box measured around a problem software cannot fix is never "healthy"."""
    ident = getattr(box, "id", None)
    if ident:
        doc["box_id"] = ident
    if baseline is None:
        baseline = results.history_baseline(box)
    verdict = decide(doc, expect, baseline)
    if unrepaired:
        verdict["reasons"] += [
            {"level": "degraded", "key": "box", "message": m, "observed": None, "expected": None}
            for m in unrepaired
        ]
        if verdict["status"] == "healthy":
            verdict["status"] = "degraded"
    results.finish(doc, verdict)
    path = results.write(doc, out_dir)
    doc["path"] = str(path)
    results.record_history({k: v for k, v in doc.items() if k != "path"})
    return doc


def bounded_tps(profile_tps: list, box_tps: list | None) -> list[int]:
    """The profile's TP sizes that the box's own `gpubox_bench.tp` allows (issue 19: a profile
    from gpubox_bench.profiles asked a `tp: [1]` box for TP 4 and 8); --tp overrides both."""
    want = [int(t) for t in profile_tps]
    if not box_tps:
        return want
    allowed = {int(t) for t in box_tps}
    return [t for t in want if t in allowed] or sorted(allowed)


def resolve_run(
    ctx, profile: str | None = None, tps: list[int] | None = None, methods: list[str] | None = None
) -> tuple[dict[str, Any], str, dict[str, Any], list[int], list[str]]:
    """(settings, profile name, profile, TP sizes, methods) a run on this box would use, every value
    checked: GpuboxError (exit 2) on a bad one. Front ends call it before anything changes (`recover
    --profile ful` must fail before the repairs, not at the benchmark after them)."""
    settings = dict(ctx.box.var("gpubox_bench", {}) or {})
    name = profile or settings.get("profile", "health")
    prof = resolve_profile(name, settings)
    tps = [int(t) for t in (tps or bounded_tps(prof["tp"], settings.get("tp")))]
    methods = [str(m) for m in (methods or prof["methods"])]
    for m in methods:
        parse_method(m)  # bad input fails before anything starts
    gpus_total = int(ctx.box.var("gpubox_gpus", 0) or 0)
    allowed = allowed_tps(gpus_total)
    for tp in tps:
        if tp < 1 or (gpus_total and tp > gpus_total):
            raise GpuboxError(
                f"TP {tp} needs {tp} GPUs but {ctx.box.name} has {gpus_total}",
                f"use --tp with values the box allows: {', '.join(map(str, allowed))}"
                if allowed
                else "use --tp with a positive number",
            )
        if allowed and tp not in allowed:
            raise GpuboxError(
                f"TP {tp} does not divide the {gpus_total} GPUs of {ctx.box.name}",
                f"use --tp with values the box allows: {', '.join(map(str, allowed))}",
            )
    return settings, name, prof, tps, methods


def run_box(
    ctx,
    profile: str | None = None,
    out_dir: str | Path | None = None,
    *,
    tps: list[int] | None = None,
    methods: list[str] | None = None,
    baseline=None,
    unrepaired: list[str] | None = None,
) -> dict[str, Any]:
    """Benchmark the box's server at each TP x method; returns the (written) result document.

    With the container reached locally the measuring happens in this process. Over SSH or
    `pct exec` the same `measure_box` runs inside the container (bench.remote) and this side
    keeps what belongs to the control node: host facts, the verdict, the result file, history."""
    settings, name, prof, tps, methods = resolve_run(ctx, profile, tps, methods)
    out = Path(out_dir) if out_dir else results.default_out_dir()
    if getattr(ctx.container.transport, "is_local", False):
        doc = measure_box(ctx, name, prof, tps, methods, settings, box_facts(ctx, settings), out / "logs")
    else:
        from .remote import run_remote

        doc = run_remote(ctx, name, prof, tps, methods, settings, out, progress=_progress)
    return _finish(doc, settings.get("expect"), ctx.box, out, baseline, unrepaired)


def allowed_tps(gpus: int) -> list[int]:
    """TP sizes a box of `gpus` GPUs allows: those whose groups tile it (the divisors of the GPU
    count: 1, 2, 4, 8 on 8 GPUs), so TP groups never straddle a remainder; [] when the count is
    not known (then only TP > 0 is checked)."""
    return [n for n in range(1, gpus + 1) if gpus % n == 0] if gpus > 0 else []


def run_url(
    url: str,
    *,
    profile: str = "health",
    out_dir: str | Path | None = None,
    tp: int = 1,
    method: str = "custom",
    box: str | None = None,
    expect: dict | None = None,
    timeout: float = 120.0,
    settings: dict[str, Any] | None = None,
    console=None,
    baseline=None,
    tokenizer_dir: str | None = None,
    phase_timeout: float | None = None,
    overrides: dict[str, Any] | None = None,
    model: str | None = None,
) -> dict[str, Any]:
    """Measure an already running server at URL (no launch, no teardown). `model`: the model to
    ask for (--model), needed where the server lists none.

    Without `box` the history is the server's own (server_identity: URL + model id)."""
    settings = settings or {}
    prof = resolve_profile(profile, settings)
    if overrides:
        from .profiles import apply_overrides

        prof = apply_overrides(prof, **overrides)
    if method != "custom":
        parse_method(method)
    info = asyncio.run(
        _server_info(url, phase_timeout or min(30.0, timeout), model)
    )  # exit 2 with the cause when nothing sane answers
    box = box or server_identity(url, info.model)
    points = plan(prof)
    doc = results.new_document(
        box, profile, simulated=bool(settings.get("simulated")), sim_speed=settings.get("sim_speed"), url=url
    )
    learned: dict[str, Any] = {}
    doc["servers"].append(
        {
            "tp": tp,
            "method": method.split(":")[0],
            "budget": None,
            "label": method,
            "gpus": [],
            "command": [],
            "env": {},
            "status": "ok",
            "error": None,
            "log_tail": None,
            "startup_s": None,
            "max_model_len": info.max_model_len,
            "url": url,
            "model": info.model,
            "client": learned,
        }
    )
    prog, step = _progress(console, len(points))
    if prog:
        prog.start()
    try:
        doc["measurements"] = asyncio.run(
            measure_server(
                url,
                tp=tp,
                label=method,
                points=points,
                prof=prof,
                timeout=timeout,
                on_point=step,
                tokenizer_dir=tokenizer_dir or settings.get("tokenizer"),
                learned=learned,
                model=model,
            )
        )
    finally:
        if prog:
            prog.stop()
    return _finish(doc, expect, box, out_dir, baseline)


async def _server_info(url: str, phase_timeout: float, model: str | None = None):
    async with Client(url, timeout=min(phase_timeout, 10.0), phase_timeout=phase_timeout, model=model) as c:
        try:
            return await c.server_info()
        except ModelNotNamed:
            raise  # the server answers: its own message says what to name
        except GpuboxError as exc:
            raise GpuboxError(
                f"no OpenAI-compatible server answers at {url}: {exc.problem}",
                "check the URL and that the server is up (GET /v1/models)",
            ) from None
