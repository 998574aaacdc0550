"""Reasons for a recommendation: the report's findings, the probe's all-reduce figures, the
servers' KV cache lines, the budget curve. Parsers for the outside documents (probe, logs) live here
too; reading the files is advice_io.py's job."""

from __future__ import annotations

import re
from typing import Any, Mapping

from .advice_model import Candidate, Config, Gap, WorkloadAdvice
from .data import ResultDoc, method_name
from .observations import Observation, f1

_KV_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_KV_GIB = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")
AUTO = ("auto", "ar", "autoregressive")


def allreduce_busbw(probe: Mapping[str, Any] | None) -> dict[tuple[int, ...], tuple[float, int]]:
    """GPU set -> (busbw GB/s, bytes) from a gpubox.probe/1 document: the largest size per set."""
    out: dict[tuple[int, ...], tuple[float, int]] = {}
    bw = (probe or {}).get("bandwidth") if isinstance(probe, Mapping) else None
    for p in (bw or {}).get("probes") or [] if isinstance(bw, Mapping) else []:
        if not isinstance(p, Mapping) or p.get("name") != "allreduce" or p.get("status") != "ok":
            continue
        gpus, v, size = p.get("gpus"), p.get("busbw_gbps"), p.get("bytes") or 0
        if not isinstance(gpus, list) or len(gpus) < 2 or not isinstance(v, (int, float)) or v <= 0:
            continue
        k = tuple(sorted(int(g) for g in gpus if isinstance(g, int)))
        if k not in out or int(size) > out[k][1]:
            out[k] = (float(v), int(size))
    return out


def _bus(b: Any) -> str:
    """'00000000:17:00.0' (NVML) and '0000:17:00.0' (sysfs) -> '17:00.0'."""
    return ":".join(str(b).lower().split(":")[-2:]) if b else ""


def probe_mismatch(run: ResultDoc, probe: Mapping[str, Any] | None) -> str | None:
    """Why the probe is not of this run's box (GPU bus ids differ by index), None when it fits or
    cannot be told. Matching all-reduce sets by index only makes sense on the same GPUs."""
    nv = (probe or {}).get("nvml") if isinstance(probe, Mapping) else None
    pg = {g.get("index"): _bus(g.get("bus_id")) for g in (nv or {}).get("gpus") or [] if isinstance(g, dict)}
    rg = {g.index: _bus(g.bus_id) for g in run.facts.gpu_list()}
    both = [i for i in rg if i in pg and rg[i] and pg[i]]
    bad = [i for i in both if rg[i] != pg[i]]
    if bad:
        i = bad[0]
        return f"GPU {i} is {rg[i]} in the run and {pg[i]} in the probe"
    return None


def kv_cache(text: str | None) -> dict[str, float]:
    """KV cache capacity a vLLM server logged at start: tokens and GiB per GPU (last seen)."""
    out: dict[str, float] = {}
    for line in str(text or "").splitlines():
        if m := _KV_TOKENS.search(line):
            out["tokens"] = float(m.group(1).replace(",", ""))
        if m := _KV_GIB.search(line):
            out["gib_per_gpu"] = float(m.group(1))
    return out


def _gpu_set(run: ResultDoc, c: Config) -> tuple[int, ...] | None:
    srv = run.server_for(c.tp, c.label)
    g = srv.gpus if srv else None
    if isinstance(g, list) and len(g) == c.tp and all(isinstance(x, int) for x in g):
        return tuple(sorted(g))
    return None


def _span(gpus: tuple[int, ...]) -> str:
    if gpus == tuple(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def _numa(run: ResultDoc, gpus: tuple[int, ...]) -> set[int] | None:
    numa = run.gpu_numa()
    nodes = {numa.get(g) for g in gpus}
    return None if None in nodes else nodes


def tp_reasons(run: ResultDoc, w: WorkloadAdvice, fs: list[Observation], busbw: dict) -> list[str]:
    b, r = w.best.config, w.runner_up.config
    out = []
    if b.tp == r.tp:
        return out
    for f in fs:
        n = f.numbers
        if (
            f.id.startswith("tp_larger_")
            and w.kind == "decode"
            and n.get("label") == b.label == r.label
            and {n.get("tp_small"), n.get("tp_large")} == {b.tp, r.tp}
            and n.get("output_len") == w.output_len
        ):
            out.append(f.text)
    gb, gr = _gpu_set(run, b), _gpu_set(run, r)
    if gb and gr and gb in busbw and gr in busbw:
        (vb, sb), (vr, _) = busbw[gb], busbw[gr]
        nb, nr = _numa(run, gb), _numa(run, gr)
        cross = [
            f"TP{c.tp} (GPUs {_span(g)}) spans NUMA nodes {' and '.join(map(str, sorted(n)))}"
            for c, g, n in ((b, gb, nb), (r, gr, nr))
            if n is not None and len(n) > 1
        ]
        out.append(
            f"probe all-reduce busbw at {sb // 2**20} MiB: {vb:.1f} GB/s over GPUs {_span(gb)} (TP{b.tp}) "
            f"vs {vr:.1f} GB/s over GPUs {_span(gr)} (TP{r.tp}, {(vr / vb - 1) * 100:+.0f}%)"
            + (f"; {'; '.join(cross)}" if cross else "")
        )
    return out


def memory_reason(run: ResultDoc, w: WorkloadAdvice, logs: Mapping[tuple[int, str], str]) -> list[str]:
    """Long context: the winner's KV cache spread over more GPUs, with the figures the run has."""
    b, r = w.best.config, w.runner_up.config
    if b.tp <= r.tp:
        return []
    mem = {g.index: g.memory_mib for g in run.facts.gpu_list()}
    parts = []
    for c in (b, r):
        g = _gpu_set(run, c)
        kv = kv_cache(logs.get((c.tp, c.label)))
        bits = []
        if "gib_per_gpu" in kv:
            bits.append(f"{kv['gib_per_gpu']:.1f} GiB KV cache per GPU")
        if "tokens" in kv:
            bits.append(f"{kv['tokens']:,.0f} KV tokens")
        if not bits and g and all(isinstance(mem.get(i), (int, float)) for i in g):
            sizes = sorted({mem[i] for i in g})
            each = (
                f"{sizes[0] / 1024:.1f} GiB"
                if len(sizes) == 1
                else f"{sizes[0] / 1024:.1f}-{sizes[-1] / 1024:.1f} GiB"
            )
            bits.append(f"{len(g)} x {each} GPUs")
        if bits:
            parts.append(f"TP{c.tp}: {', '.join(bits)}")
    text = (
        f"TP{b.tp} shards the KV cache over {b.tp} GPUs against TP{r.tp}'s {r.tp}: each GPU holds and "
        f"reads 1/{b.tp} of the long prompt's cache at every decode step, not 1/{r.tp}"
    )
    return [text + (f" ({'; '.join(parts)})" if parts else "")]


def budget_reasons(run: ResultDoc, w: WorkloadAdvice) -> tuple[list[str], list[Gap]]:
    """Budgets of the winner's method compared at this point: the curve and where it was measured."""
    b = w.best.config
    if b.budget is None:
        return [], []
    same = [
        p for p in w.ranking if p.config.family == b.family and p.config.budget is not None
    ]  # measured here, any TP
    by_tp: dict[int, list[Candidate]] = {}
    for p in same:
        by_tp.setdefault(p.config.tp, []).append(p)
    reasons, gaps = [], []
    swept = {tp: ps for tp, ps in by_tp.items() if len(ps) > 1}
    for tp, ps in sorted(swept.items()):
        ps = sorted(ps, key=lambda p: p.config.budget)
        top = max(ps, key=lambda p: p.value)
        others = [p for p in ps if p is not top]
        txt = (
            f"budget {top.config.budget} beat {'/'.join(str(p.config.budget) for p in others)} at TP{tp} "
            f"({f1(top.value)} vs {'/'.join(f1(p.value) for p in others)} tok/s)"
        )
        acc = [p.accept_len for p in ps]
        if top is ps[0] and all(a is not None for a in acc) and acc[-1] > acc[0]:
            txt += (
                f" while the acceptance length grew {acc[0]:.1f} -> {acc[-1]:.1f}: longer drafts are accepted "
                "further but cost more to verify, so the curve peaks early"
            )
        reasons.append(txt)
    if swept and b.tp not in swept:
        budgets = sorted({p.config.budget for ps in swept.values() for p in ps} - {b.budget})
        tps = "/".join(f"TP{t}" for t in sorted(swept))
        gaps.append(
            Gap(
                "not_measured",
                f"{b.family} budgets {'/'.join(map(str, budgets))} at TP{b.tp} {w.where} not measured "
                f"(budgets were compared at {tps} only)",
                w.id,
            )
        )
    return reasons, gaps


def method_reason(w: WorkloadAdvice) -> list[str]:
    b = w.best
    if str(b.config.method).lower() in AUTO:
        return []
    auto = [p for p in w.ranking if p.config.tp == b.config.tp and str(p.config.method).lower() in AUTO]
    if not auto:
        return []
    a = auto[0]
    return [
        f"{b.config.family} is {b.value / a.value:.1f}x auto at TP{b.config.tp} ({f1(b.value)} vs {f1(a.value)} tok/s)"
    ]


def finding_reasons(w: WorkloadAdvice, fs: list[Observation] | "ReasonIndex", ref: int | None) -> list[str]:
    """The findings that explain W's winner, in the findings' order. FS may be a ReasonIndex
    built once per run (advise does): then only the findings that can match W are looked at,
    so the cost per point does not grow with the number of configurations."""
    idx = fs if isinstance(fs, ReasonIndex) else ReasonIndex(fs)
    b = w.best.config
    cands = list(idx.drift.get(_key(b.label), ()))
    if w.kind == "long_context":
        cands += idx.long.get(_key(w.context_tokens), ())
    elif w.kind == "concurrency":
        cands += idx.conc.get((f"tp{b.tp}", _key(w.concurrency)), ())
    elif w.kind == "decode" and w.output_len == ref:
        cands += idx.auto_flat
    out = []
    for _, f in sorted(cands, key=lambda pf: pf[0]):
        if f.id == "acceptance_drift":
            out.append("caution: " + f.text)
        elif f.id == "concurrency_gain":
            if f.text.startswith(method_name(b.method, b.budget)):
                out.append(f.text)
        else:
            out.append(f.text)
    return out


def _key(v):
    """V as a dict key (a value from a document may be unhashable: then it matches nothing)."""
    try:
        hash(v)
    except TypeError:
        return object()
    return v


class ReasonIndex:
    """The run's findings by what a point must match to use them: long-context findings by
    context size, concurrency gains by (tpN, highest C), acceptance drift by label; each with its
    position, so a point's reasons keep the findings' order."""

    def __init__(self, fs: list[Observation]):
        self.long: dict = {}
        self.conc: dict = {}
        self.drift: dict = {}
        self.auto_flat: list = []
        for pos, f in enumerate(fs):
            n = f.numbers
            if f.id.startswith("long_context_"):
                self.long.setdefault(_key(n.get("context_tokens")), []).append((pos, f))
            elif f.id == "concurrency_gain":
                highs = [v["c_high"] for v in n.values() if isinstance(v, dict) and "c_high" in v]
                if highs:
                    top = _key(max(highs))
                    for k in n:
                        self.conc.setdefault((k, top), []).append((pos, f))
            elif f.id == "auto_flat":
                self.auto_flat.append((pos, f))
            if f.id == "acceptance_drift":
                self.drift.setdefault(_key(n.get("label")), []).append((pos, f))
