"""The benchmark inside a container that gpubox reaches over SSH or `pct exec`.

The server has to start where the GPUs and the staged model are, and the client has to measure
next to it (a WAN or `pct exec` hop between client and server would be part of every TTFT), so
when the container is not local the control node runs this module there as a payload
(gpubox.transport.payload: gpubox's modules it needs, zipped, run with `<gpubox_python>`; gpubox
need not be installed in the container) and sends it one JSON request on stdin; it runs the SAME
measuring loop as a local run (bench.measure.measure_box) and answers with the result document.
`<gpubox_python>` must have the benchmark's libraries (httpx, psutil, prometheus_client, pyyaml:
an inference server's venv has them); `--check` imports them first, so a python without them is
refused before anything starts.

Split of work (what needs which machine):
- control side (`run_remote`): facts that need the Proxmox host (NUMA balancing, topology from
  its sysfs, the GPU choice per TP), the NCCL profile resolved to variables (profiles may live in
  the control node's profile directories), then the verdict, the result file and the history
  (bench.runner._finish), so history and reports stay where `gpubox` is run;
- container side (`serve`, `main`): launch, measure, tear down; progress lines on stderr, the
  document as the last line of stdout.

The request (protocol 1):
    {"protocol": 1, "box": "ct200", "profile": "health", "tps": [1, 4, 8], "methods": [...],
     "container": {"name": ..., "vars": {gpubox_* vars}}, "host": {"name": ..., "vars": {...}},
     "facts": {...box_facts...}, "topology": {...Topology.to_dict()...} | null,
     "log_dir": "/var/tmp/gpubox/bench-logs"}
The reply: {"document": {...}} (exit 0) or {"error": {"problem": ..., "fix": ...}} (exit 2).
Only gpubox_* variables travel: connection settings and keys of the control node never do.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError

PROTOCOL = 1
ENTRY = "gpubox.bench.remote"  # this module, run in the container as a payload
LIBRARIES = ("httpx", "psutil", "prometheus_client", "pyyaml")  # what it imports from outside gpubox
DEFAULT_PYTHON = "python3"
DEFAULT_LOG_DIR = "/var/tmp/gpubox/bench-logs"  # logical path in the container (under gpubox_root)
PROBE_TIMEOUT = 60
LOG_COPY_MAX = 8 << 20  # bytes of each server log brought back to the control node (its tail)


# -- control side --------------------------------------------------------------------------------
def _gpubox_vars(entry_vars: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry_vars.items() if k.startswith("gpubox_")}


def build_request(
    ctx, name: str, tps: list[int], methods: list[str], settings: dict[str, Any]
) -> dict[str, Any]:
    """Everything the container side needs, resolved here where the Proxmox host is reachable."""
    from .gpus import box_topology
    from .launcher import gpus_for_tp, nccl_env
    from .measure import box_facts

    facts = box_facts(ctx, settings)
    for tp in tps:
        gpus_for_tp(int(tp), ctx)  # a TP size the topology cannot hold fails here, before any launch
    topo = box_topology(ctx)
    bench = dict(settings)
    # The profile's variables under the box's own gpubox_bench.env, the order spec_from_box uses.
    bench["env"] = {**nccl_env(ctx), **{str(k): str(v) for k, v in (settings.get("env") or {}).items()}}
    ct_vars = _gpubox_vars(ctx.box.container.vars)
    host_vars = _gpubox_vars(ctx.box.host.vars)
    for v in (ct_vars, host_vars):
        v.pop("gpubox_nccl_profile", None)  # already resolved into gpubox_bench.env
    ct_vars["gpubox_bench"] = bench
    ct_vars["gpubox_connection"] = "local"  # in there, the container is this machine
    return {
        "protocol": PROTOCOL,
        "box": ctx.box.name,
        "profile": name,
        "tps": [int(t) for t in tps],
        "methods": [str(m) for m in methods],
        "container": {"name": ctx.box.container.name, "vars": ct_vars},
        "host": {"name": ctx.box.host.name, "vars": host_vars},
        "facts": facts,
        "topology": topo.to_dict() if topo is not None else None,
        "log_dir": str(settings.get("remote_log_dir") or DEFAULT_LOG_DIR),
    }


def remote_timeout(prof: dict[str, Any], settings: dict[str, Any], launches: int) -> float:
    """An upper bound for the whole remote run: every launch may take ready_timeout, every
    request its deadline (the same bounds the local loop applies); gpubox_bench.remote_timeout wins."""
    if settings.get("remote_timeout"):
        return float(settings["remote_timeout"])
    from .profiles import plan

    timeout = float(settings.get("request_timeout", 120))
    deadline = float(prof.get("request_deadline_s", max(timeout * 8, 60.0)))
    per_point = (int(prof.get("warmup", 1)) + int(prof.get("repetitions", 3))) * deadline
    per_launch = float(settings.get("ready_timeout", 900)) + len(plan(prof)) * per_point + 60
    return launches * per_launch + 120


def _last_line(text: str) -> str:
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1] if lines else ""


def probe(ctx, python: str) -> None:
    """Refuse early, with the fix, when the container's python cannot run the benchmark's side
    (its payload with `--check`: the libraries it imports are there)."""
    from gpubox.transport import payload  # control side only: not shipped with this module

    r = payload.run(ctx.container, ENTRY, ["--check"], python=python, timeout=PROBE_TIMEOUT)
    if r.rc == 0:
        return
    why = _last_line(r.stderr) or _last_line(r.stdout) or f"exit {r.rc}"
    raise GpuboxError(
        f"{ctx.box.name}: the benchmark runs inside the container, but `{python}` cannot run it there: {why}",
        f"set gpubox_python to an interpreter with {', '.join(LIBRARIES)} (the inference server's venv has "
        "them, e.g. /opt/vllm/bin/python3; gpubox itself need not be installed there); or start the "
        "server yourself and use `gpubox bench run --url http://...`",
    )


def _parse_reply(ctx, python: str, r) -> dict[str, Any]:
    reply = None
    try:
        reply = json.loads(_last_line(r.stdout))
    except ValueError:
        pass
    if isinstance(reply, dict) and isinstance(reply.get("error"), dict):
        e = reply["error"]
        raise GpuboxError(f"{ctx.box.name} (in the container): {e.get('problem')}", e.get("fix"))
    if r.rc != 0 or not isinstance(reply, dict) or not isinstance(reply.get("document"), dict):
        why = _last_line(r.stderr) or _last_line(r.stdout) or "no output"
        raise GpuboxError(
            f"{ctx.box.name}: the benchmark's side (`{python}`, {ENTRY}) in the container exited {r.rc}: {why}",
            "run `gpubox -v bench` to see its output",
        )
    return reply["document"]


def _fetch_logs(ctx, doc: dict[str, Any], out: Path) -> None:
    """Copy each server log (its tail) next to the result, so `log` points at a file on this
    machine as it does after a local run; a log that cannot be read keeps its container path."""
    dest = out / "logs" / doc["run_id"]
    for rec in doc.get("servers", []):
        src = rec.get("log")
        if not src:
            continue
        try:
            st = ctx.container.transport.stat(src)
            if st is None:
                continue
            if st.size > LOG_COPY_MAX:
                r = ctx.container.run(["tail", "-c", str(LOG_COPY_MAX), "--", src], timeout=60)
                data = r.stdout.encode() if r.ok else b""
            else:
                data = ctx.container.transport.read_bytes(src)
            from gpubox.safeio import write_atomic

            dest.mkdir(parents=True, exist_ok=True)
            local = dest / Path(src).name
            write_atomic(local, data)  # never through a link planted at that name
            rec["log"] = str(local)
        except (OSError, GpuboxError):
            continue


def run_remote(
    ctx,
    name: str,
    prof: dict[str, Any],
    tps: list[int],
    methods: list[str],
    settings: dict[str, Any],
    out: Path,
    progress=None,
) -> dict[str, Any]:
    """Measure inside the container through its transport; the document without a verdict.
    `progress(console, total)` makes the bar (bench.runner hands its own)."""
    python = str(ctx.box.var("gpubox_python") or DEFAULT_PYTHON)
    probe(ctx, python)
    req = build_request(ctx, name, tps, methods, settings)
    launches = len(tps) * len(methods)
    timeout = remote_timeout(prof, settings, launches)
    from gpubox.progress import Relay, without_progress
    from gpubox.transport import payload  # control side only: not shipped with this module

    from .measure import _progress
    from .profiles import plan

    # Each measurement as the container runs it: its progress lines, relayed live by the transport.
    prog, step = (progress or _progress)(ctx.console, launches * len(plan(prof)))
    relay = Relay(step=step)
    if prog:
        prog.start()
    try:
        r = payload.run(
            ctx.container,
            ENTRY,
            python=python,
            input=json.dumps(req, default=str),
            timeout=timeout,
            on_stderr=relay,
        )
    finally:
        if prog:
            prog.stop()
    r.stderr = without_progress(r.stderr)
    doc = _parse_reply(ctx, python, r)
    if ctx.console is not None and getattr(ctx, "verbose", False) and r.stderr.strip():
        ctx.console.print(r.stderr.rstrip(), markup=False, highlight=False)
    _fetch_logs(ctx, doc, out)
    return doc


# -- container side ------------------------------------------------------------------------------
class _HostOutOfReach:
    """The Proxmox host seen from inside the container: not reachable. Host facts come in the
    request, so touching this is a gpubox bug, reported as one line, not an SSH attempt."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attr: str):
        raise GpuboxError(
            f"{self.name}: the Proxmox host is not reachable from inside the container (asked for {attr!r})",
            "this is a gpubox bug: host facts belong in the request (bench.remote.build_request)",
        )

    def close(self) -> None:
        pass


def _topology(d: dict[str, Any]):
    from gpubox.hwtune.topology import Gpu, Topology

    fields = Gpu.__dataclass_fields__
    gpus = [Gpu(**{k: g.get(k) for k in fields}) for g in d.get("gpus", [])]
    return Topology(
        d.get("source") or "request",
        gpus,
        dict(d.get("pairs") or {}),
        d.get("driver"),
        list(d.get("notes") or []),
    )


def context_from(req: dict[str, Any]):
    """A Context for the container side: the container is this machine (local transport, its
    gpubox_root kept), the Proxmox host is out of reach."""
    from gpubox.context import Context
    from gpubox.host import Host
    from gpubox.inventory import Box, HostEntry
    from gpubox.transport.local import LocalTransport

    try:
        ct = HostEntry(str(req["container"]["name"]), dict(req["container"]["vars"]))
        host = HostEntry(str(req["host"]["name"]), dict(req["host"]["vars"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise GpuboxError(
            f"benchmark request lacks {exc}", "send the request bench.remote.build_request makes"
        ) from None
    from gpubox.invschema import check_box

    # The one input gate on the container side too: what arrives here is checked as the CLI and
    # the Ansible module check it (a request is input, whoever built it).
    check_box(ct.name, ct.vars, host.name, host.vars)
    ctx = Context(
        box=Box(container=ct, host=host),
        _hosts=(_HostOutOfReach(host.name), Host(ct, LocalTransport(ct.name), "container")),
    )
    if req.get("topology"):
        from .gpus import GpuTopology

        ctx.know(GpuTopology, _topology(req["topology"]))  # read on the control side, where the host is
    return ctx


def serve(req: dict[str, Any], step=None) -> dict[str, Any]:
    """Run the request's measurements here; the document without a verdict."""
    from .measure import measure_box
    from .profiles import resolve_profile

    if not isinstance(req, dict) or req.get("protocol") != PROTOCOL:
        got = req.get("protocol") if isinstance(req, dict) else None
        raise GpuboxError(
            f"benchmark request protocol {got!r}, this gpubox speaks {PROTOCOL}",
            "install the same gpubox version in the container as on the control node",
        )
    ctx = context_from(req)
    settings = dict(ctx.box.var("gpubox_bench", {}) or {})
    name = str(req["profile"])
    prof = resolve_profile(name, settings)
    log_root = Path(ctx.container.path(str(req.get("log_dir") or DEFAULT_LOG_DIR)))
    return measure_box(
        ctx,
        name,
        prof,
        [int(t) for t in req["tps"]],
        [str(m) for m in req["methods"]],
        settings,
        dict(req.get("facts") or {}),
        log_root,
        step=step,
    )


def _line_step(beat):
    """Progress as gpubox.progress lines on stderr, relayed live to the control node."""

    def step(desc: str, advance: bool = True) -> None:
        beat.emit(ev="step", desc=desc, advance=bool(advance))

    return step


def preflight() -> int:
    """`--check`: import what `serve` runs, so a python without the benchmark's libraries is
    refused (the missing module named on stderr) before a server starts."""
    from gpubox.context import Context  # noqa: F401
    from gpubox.host import Host  # noqa: F401
    from gpubox.inventory import Box  # noqa: F401
    from gpubox.invschema import check_box  # noqa: F401
    from gpubox.progress import Heartbeat  # noqa: F401
    from gpubox.transport.local import LocalTransport  # noqa: F401

    from .gpus import GpuTopology  # noqa: F401
    from .measure import measure_box  # noqa: F401
    from .profiles import resolve_profile  # noqa: F401

    return 0


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--check"]:
        return preflight()
    try:
        try:
            req = json.loads(sys.stdin.read())
        except ValueError as exc:
            raise GpuboxError(
                f"benchmark request on stdin is not JSON ({exc})",
                "this entry point is called by `gpubox bench`/`recover`; send it their request",
            ) from None
        from gpubox.progress import Heartbeat

        with Heartbeat() as beat:  # "alive" while a server starts: minutes without a step
            doc = serve(req, step=_line_step(beat))
    except GpuboxError as exc:
        print(json.dumps({"error": {"problem": exc.problem, "fix": exc.fix}}), flush=True)
        return 2
    except Exception:
        traceback.print_exc()
        return 1
    sys.stdout.write("\n" + json.dumps({"document": doc}, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
