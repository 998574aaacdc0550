"""Prometheus node_exporter textfile-collector output for the last health check.

The text is produced by prometheus_client (one HELP/TYPE per metric, label escaping and the
exposition format done by the library, not by hand) and written atomically: node_exporter's
textfile collector reads only `*.prom`, so the file is written under a temporary name in the
same directory and renamed over `<dir>/gpubox_<box>.prom` (what its docs prescribe, so a scrape
never sees half a file).

Metrics (all gauges):
    gpubox_health{box}                             0 healthy, 1 degraded, 2 failed
    gpubox_last_run_timestamp_seconds{box}         when the last run finished (Unix time)
    gpubox_last_run_duration_seconds{box}
    gpubox_bench_tokens_per_second{box,key,tp,method,label,workload,output_len,concurrency,context_tokens}
    gpubox_bench_aggregate_tokens_per_second{...same}   concurrency workloads only
    gpubox_acceptance_length{...same}              mean acceptance length (spec decode only)
    gpubox_bench_measurement_ok{...same}           1 ok, 0 failed or skipped
    gpubox_step_ok{box,step,host}                  doctor's findings: 1 ok/fixed, 0 drift/failed/blocked
"""

from __future__ import annotations

import calendar
import posixpath
import time
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from .regress import LEVELS

DEFAULT_DIR = "/var/lib/prometheus/node-exporter"  # Debian's prometheus-node-exporter textfile dir
M_LABELS = ("box", "key", "tp", "method", "label", "workload", "output_len", "concurrency", "context_tokens")


def _ts(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return float(calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _lbl(v: Any) -> str:
    """A label value from a document: control characters and bidi overrides shown escaped
    (gpubox.escape.terminal), so `cat` or `curl` of the textfile cannot drive a terminal; a
    newline is kept, since prometheus_client writes it as `\\n`, as the exposition format says,
    and a reader gets the value back as it was."""
    from gpubox.escape import terminal

    return "" if v is None else terminal(v, newlines=True)


def render(
    doc: dict[str, Any] | None, doctor: dict[str, Any] | None = None, *, box: str | None = None
) -> str:
    """Exposition text for a judged result document and/or a doctor RunReport dict."""
    box = _lbl(box or (doc or {}).get("box") or (doctor or {}).get("box") or "-")
    reg = CollectorRegistry()

    def g(name: str, doc_: str, labels=("box",)) -> Gauge:
        return Gauge(name, doc_, labelnames=labels, registry=reg)

    if doc is not None:
        status = (doc.get("verdict") or {}).get("status", "failed")
        g("gpubox_health", "Health of the last scheduled check: 0 healthy, 1 degraded, 2 failed.").labels(
            box=box
        ).set(LEVELS.get(status, 2))
        fin, start = _ts(doc.get("finished_at")), _ts(doc.get("started_at"))
        if fin or start:
            g("gpubox_last_run_timestamp_seconds", "Unix time the last health benchmark finished.").labels(
                box=box
            ).set(fin or start)
        if fin and start:
            g("gpubox_last_run_duration_seconds", "Wall time of the last health benchmark.").labels(
                box=box
            ).set(fin - start)
        tok = g(
            "gpubox_bench_tokens_per_second",
            "Per-request decode tokens/s (median over repetitions).",
            M_LABELS,
        )
        agg = g(
            "gpubox_bench_aggregate_tokens_per_second",
            "Output tokens/s summed over concurrent requests.",
            M_LABELS,
        )
        acc = g(
            "gpubox_acceptance_length",
            "Mean speculative-decoding acceptance length (1 + accepted/drafts).",
            M_LABELS,
        )
        ok = g(
            "gpubox_bench_measurement_ok",
            "1 when the measurement ran, 0 when it failed or was skipped.",
            M_LABELS,
        )
        for m in doc.get("measurements") or []:
            if not m.get("key"):
                continue
            labels = {k: _lbl(m.get(k)) for k in M_LABELS if k != "box"}
            labels["box"] = box
            ok.labels(**labels).set(1 if m.get("status", "ok") == "ok" else 0)
            if m.get("status", "ok") != "ok":
                continue  # no figures for what did not run: absent, never zero
            concurrent = m.get("workload") == "concurrency" or (m.get("concurrency") or 1) > 1
            for gauge, v in (
                (tok, _num(m.get("tok_s"))),
                (agg, _num(m.get("aggregate_tok_s")) if concurrent else None),
                (acc, _num((m.get("acceptance") or {}).get("mean_length"))),
            ):
                if v is not None:
                    gauge.labels(**labels).set(v)
    if doctor is not None:
        step = g(
            "gpubox_step_ok",
            "Doctor finding per step: 1 ok or fixed, 0 drift, failed or blocked.",
            ("box", "step", "host"),
        )
        for s in doctor.get("steps") or []:
            st = s.get("status")
            if st == "skipped" and not (s.get("evidence") or {}).get("blocked_by"):
                continue
            step.labels(box=box, step=_lbl(s.get("name")), host=_lbl(s.get("host"))).set(
                1 if st in ("ok", "fixed") else 0
            )
    return generate_latest(reg).decode()


def textfile_path(box: str, directory: str = DEFAULT_DIR) -> str:
    return posixpath.join(directory, f"gpubox_{box}.prom")


def write(host, box: str, text: str, directory: str = DEFAULT_DIR) -> str:
    """Write TEXT atomically to `<directory>/gpubox_<box>.prom` on HOST (a gpubox Host).

    No backup: the file is regenerated on every run and holds no one's edits. The temporary
    name does not end in .prom, so the collector never reads it."""
    path = textfile_path(box, directory)
    host.write(path, text, mode=0o644, backup=False)
    return path
