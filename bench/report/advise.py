"""Advice: from a run's own numbers to a decision (which TP x method x budget for which workload).

Results in, typed advice out; nothing here reads files or prints (renderers lay `Advice` out, the
CLI and `make_report` gather the inputs). For every workload point of a run (single request per
output length, concurrency C, long context N tokens, agentic prompt) the configurations measured
there are ranked by their headline figure (`Measurement.value`: aggregate tok/s under
concurrency, decode tok/s otherwise). The best one's margin over the runner-up is called larger
than the noise only when a noise estimate exists and

    margin > NOISE_K x pooled sd,   pooled sd = sqrt((sd_best^2 + sd_runner_up^2) / 2)

where sd is the standard deviation of one figure: from the run's repetitions (the recorded
min/max spread over n repetitions, divided by the range constant d2(n): the expected range of
n standard normal draws, Tippett 1925) or from the box's earlier healthy runs (sample
standard deviation over at least MIN_HISTORY of them); the larger when both exist, since a
decision must survive a restart, not only the next repetition. With NOISE_K = 2 two single runs
of the two configurations come out in the same order about 92% of the time (normal noise:
P = Phi(2 / sqrt 2)). Without any estimate the advice says "noise unknown" and never claims the
margin is real.

Where the data cannot decide, the advice names the run that would: a configuration that wins
elsewhere but was not measured at this point, a budget sweep done at another TP only, a margin
inside the noise (more repetitions), a failed or context-cut measurement (never dropped).
"""

from __future__ import annotations

import functools
import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from gpubox.errors import GpuboxError

from .data import Measurement, Run, from_doc, method_name, method_order
from .findings import Finding, ctx_name, f1, ref_len
from .findings import findings as run_findings

NOISE_K = 2.0
MIN_HISTORY = 3  # earlier healthy runs needed for a history noise estimate
HISTORY_RUNS = 10  # at most this many of the newest earlier runs
RULE = (
    f"a margin is larger than the noise when it exceeds {NOISE_K:g} x the pooled standard deviation "
    "of one figure; the standard deviation comes from the run's repetitions (min/max spread / d2(n)) "
    f"or from the box's earlier healthy runs (at least {MIN_HISTORY}), the larger when both exist; "
    "without either the noise is unknown"
)
# a reason that names the context limit: gpubox's own refusal (ContextTooLong: "... exceeds the
# server's max_model_len ..."), vLLM's HTTP 400 ("This model's maximum context length is ...") and
# its scheduler ("Input prompt (N tokens) is too long and exceeds limit of M"). A bare HTTP 400 is
# not enough: servers answer 400 for other reasons too (rejected sampling fields).
_CUT = re.compile(r"max_model_len|max-model-len|context (window|length)|too long and exceeds limit", re.I)
_KV_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_KV_GIB = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")
AUTO = ("auto", "ar", "autoregressive")

# decision states of one workload point
CLEAR, WITHIN, UNKNOWN, SINGLE, NONE = "clear", "within_noise", "noise_unknown", "single", "none"


# --- typed advice -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    tp: int
    label: str
    method: str | None = None
    budget: int | None = None

    @property
    def name(self) -> str:
        return f"TP{self.tp} {method_name(self.method, self.budget)}"

    @property
    def family(self) -> str:
        return method_name(self.method, None)

    def to_dict(self) -> dict:
        return {
            "tp": self.tp,
            "label": self.label,
            "method": self.method,
            "budget": self.budget,
            "name": self.name,
        }


@dataclass
class Noise:
    sd: float | None  # standard deviation of one figure, in the point's unit
    source: str  # repeats | history | none
    detail: str

    def to_dict(self) -> dict:
        return {"sd": self.sd, "source": self.source, "detail": self.detail}


@dataclass
class Point:
    config: Config
    key: str
    value: float
    noise: Noise
    accept_len: float | None = None

    def to_dict(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "key": self.key,
            "value": self.value,
            "noise": self.noise.to_dict(),
            "accept_len": self.accept_len,
        }


@dataclass
class Gap:
    kind: str  # not_measured | failed | skipped | cut_by_context | within_noise | noise_unknown
    text: str
    workload: str | None = None
    key: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "text": self.text, "workload": self.workload, "key": self.key}


@dataclass
class WorkloadAdvice:
    id: str  # the measurement key without "tp<N>/<label>/": decode/out1024, concurrency/c8/out1024
    kind: str  # decode | concurrency | long_context | agentic
    title: str
    where: str  # "at 100k context", for sentences
    unit: str
    ranking: list[Point]
    decision: str  # clear | within_noise | noise_unknown | single | none
    margin: float | None = None
    noise_sd: float | None = None
    noise_source: str = "none"
    output_len: int | None = None
    concurrency: int | None = None
    context_tokens: int | None = None
    reasons: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)

    @property
    def best(self) -> Point | None:
        return self.ranking[0] if self.ranking else None

    @property
    def runner_up(self) -> Point | None:
        return self.ranking[1] if len(self.ranking) > 1 else None

    @property
    def margin_pct(self) -> float | None:
        r = self.runner_up
        return None if self.margin is None or r is None or not r.value else self.margin / r.value * 100

    @property
    def best_text(self) -> str:
        b = self.best
        return f"{b.config.name}: {f1(b.value)} {self.unit}" if b else "none measured"

    @property
    def runner_text(self) -> str:
        r = self.runner_up
        return f"{r.config.name}: {f1(r.value)}" if r else "none"

    @property
    def margin_text(self) -> str:
        if self.margin is None:
            return ""
        r = self.runner_up.value
        rel = f"{(r + self.margin) / r:.1f}x" if r and self.margin / r >= 0.5 else f"{self.margin_pct:+.1f}%"
        return f"+{f1(self.margin)} ({rel})"

    @property
    def noise_text(self) -> str:
        """Short: 'exceeds (2 x 4.37, repeats)', 'inside (...)', 'noise unknown', 'no runner-up'."""
        if self.decision in (CLEAR, WITHIN):
            word = "exceeds the noise" if self.decision == CLEAR else "inside the noise"
            return f"{word} ({NOISE_K:g} x {self.noise_sd:.2f}, {self.noise_source})"
        return {UNKNOWN: "noise unknown", SINGLE: "no runner-up", NONE: "not measured"}[self.decision]

    @property
    def verdict(self) -> str:
        """One sentence on the margin and the noise."""
        b, r = self.best, self.runner_up
        if b is None:
            return "no configuration measured successfully"
        if r is None:
            return "only one configuration measured: no runner-up to compare with"
        head = f"+{f1(self.margin)} {self.unit} ({self.margin_pct:+.1f}%) over {r.config.name}"
        if self.decision == UNKNOWN:
            return f"{head}: noise unknown ({b.noise.detail})"
        limit = NOISE_K * self.noise_sd
        src = self.noise_source
        if self.decision == CLEAR:
            return f"{head}: exceeds the noise ({f1(self.margin)} > {NOISE_K:g} x {self.noise_sd:.2f}, {src})"
        return f"{head}: inside the noise ({f1(self.margin)} <= {f1(limit)}, {NOISE_K:g} x {self.noise_sd:.2f}, {src})"

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "kind": self.kind,
            "title": self.title,
            "unit": self.unit,
            "decision": self.decision,
            "best": self.best.to_dict() if self.best else None,
            "runner_up": self.runner_up.to_dict() if self.runner_up else None,
            "margin": self.margin,
            "margin_pct": None if self.margin_pct is None else round(self.margin_pct, 2),
            "noise_sd": self.noise_sd,
            "noise_source": self.noise_source,
            "exceeds_noise": {CLEAR: True, WITHIN: False}.get(self.decision),
            "verdict": self.verdict,
            "ranking": [p.to_dict() for p in self.ranking],
            "output_len": self.output_len,
            "concurrency": self.concurrency,
            "context_tokens": self.context_tokens,
            "reasons": self.reasons,
            "gaps": [g.to_dict() for g in self.gaps],
        }


@dataclass
class PlanRow:
    when: str
    config: Config
    evidence: str
    decided: bool  # the row's margin exceeds the noise
    workloads: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "when": self.when,
            "config": self.config.to_dict(),
            "evidence": self.evidence,
            "decided": self.decided,
            "workloads": self.workloads,
        }


@dataclass
class Advice:
    run: str
    box: str
    simulated: bool
    workloads: list[WorkloadAdvice]
    plan: list[PlanRow]
    gaps: list[Gap]
    rule: str = RULE
    notes: list[str] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        """A default exists and every row of the plan is beyond the noise."""
        return bool(self.plan) and all(r.decided for r in self.plan)

    @property
    def broken(self) -> list[Gap]:
        """Gaps where the run tried and did not get a figure (failed, skipped, cut by the context)."""
        return [g for g in self.gaps if g.kind in ("failed", "skipped", "cut_by_context")]

    @property
    def exit_code(self) -> int:
        """0 the plan is decided and nothing the run tried failed; 1 otherwise (problems remain)."""
        return 0 if self.decided and not self.broken else 1

    def to_dict(self) -> dict:
        return {
            "run": self.run,
            "box": self.box,
            "simulated": self.simulated,
            "decided": self.decided,
            "exit_code": self.exit_code,
            "rule": self.rule,
            "noise_k": NOISE_K,
            "plan": [r.to_dict() for r in self.plan],
            "workloads": [w.to_dict() for w in self.workloads],
            "gaps": [g.to_dict() for g in self.gaps],
            "notes": self.notes,
        }


# --- inputs from outside the result (parsed here, read by the caller) -------------------------


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


def probe_mismatch(run: Run, probe: Mapping[str, Any] | None) -> str | None:
    """Why the probe is not of this run's box (GPU bus ids differ by index), None when it fits or
    cannot be told. Matching all-reduce sets by index only makes sense on the same GPUs."""
    nv = (probe or {}).get("nvml") if isinstance(probe, Mapping) else None
    pg = {g.get("index"): _bus(g.get("bus_id")) for g in (nv or {}).get("gpus") or [] if isinstance(g, dict)}
    rg = {g.get("index"): _bus(g.get("bus_id")) for g in run.facts.get("gpus") or [] if isinstance(g, dict)}
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


# --- noise --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def d2(n: int) -> float:
    """The expected range of n standard normal draws (the control-chart constant d2, Tippett 1925):
    integral of 1 - Phi(x)^n - (1 - Phi(x))^n over x, by Simpson's rule; d2(2) = 1.128,
    d2(3) = 1.693, d2(4) = 2.059. Computed rather than tabled so any repetition count works."""
    if n < 2:
        raise ValueError("d2 needs n >= 2")

    def f(x: float) -> float:
        phi = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        return 1 - phi**n - (1 - phi) ** n

    lo, hi, k = -10.0, 10.0, 4000
    h = (hi - lo) / k
    total = f(lo) + f(hi) + sum((4 if i % 2 else 2) * f(lo + i * h) for i in range(1, k))
    return total * h / 3


def repeat_noise(m: Measurement) -> Noise | None:
    """sd of one figure from the min/max spread over the measurement's repetitions. Fields are
    read by attribute (schema names) so a typed Measurement serves as well as the dict-backed one."""
    n, spread = getattr(m, "repetitions", None), getattr(m, "tok_s_spread", None)
    if not isinstance(n, int) or n < 2 or not isinstance(spread, list) or len(spread) != 2:
        return None
    lo, hi = spread
    if not all(isinstance(x, (int, float)) for x in (lo, hi)) or hi < lo:
        return None
    sd = (hi - lo) / d2(n)
    detail = f"spread of {n} repetitions"
    if m.workload == "concurrency":  # the spread is of per-request tok/s: scale it to the aggregate
        tok = getattr(m, "tok_s", None)
        if not isinstance(tok, (int, float)) or tok <= 0 or m.value is None:
            return None
        sd *= m.value / tok
        detail += " (per-request spread scaled to the aggregate)"
    return Noise(sd, "repeats", detail)


def history_noise(key: str, history: list[Run]) -> Noise | None:
    vals = []
    for r in history[-HISTORY_RUNS:]:
        if (r.verdict or {}).get("status") != "healthy":
            continue  # a degraded run is a regression, not noise
        m = next((x for x in r.measurements if x.key == key), None)
        if m is not None and m.value is not None:
            vals.append(m.value)
    if len(vals) < MIN_HISTORY:
        return None
    return Noise(statistics.stdev(vals), "history", f"{len(vals)} earlier healthy runs of the box")


def point_noise(m: Measurement, history: list[Run]) -> Noise:
    found = [n for n in (repeat_noise(m), history_noise(m.key, history)) if n is not None]
    if not found:
        reps = getattr(m, "repetitions", None)
        have = (
            f"{reps} repetition" + ("s" if reps != 1 else "") if isinstance(reps, int) else "no repetitions"
        )
        return Noise(None, "none", f"{have}, fewer than {MIN_HISTORY} earlier healthy runs of the box")
    top = max(found, key=lambda n: n.sd)
    if len(found) == 2:
        other = found[1] if top is found[0] else found[0]
        top = Noise(top.sd, top.source, f"{top.detail}; larger than {other.source} ({other.sd:.2f})")
    return top


# --- workload points ----------------------------------------------------------------------------


def point_id(m: Measurement) -> str:
    """The key without its tp<N>/<label>/ prefix: the same workload point across configurations."""
    parts = str(m.key).split("/", 2)
    return parts[2] if len(parts) == 3 else f"{m.workload}/{m.output_len}/{m.concurrency}/{m.context_tokens}"


def config_of(m: Measurement) -> Config:
    return Config(m.tp, str(m.label), m.method, m.budget)


def _titles(run: Run, pid: str, m: Measurement) -> tuple[str, str, str]:
    """(title, 'at ...' phrase, unit) of a workload point."""
    w = m.workload
    if w == "decode":
        lens = sorted({x.output_len for x in run.select("decode") if x.output_len})
        n = m.output_len
        kind = "single request"
        if len(lens) > 1 and n == lens[0]:
            kind = "short single request"
        elif len(lens) > 1 and n == lens[-1]:
            kind = "long decode"
        return f"{kind}, {n}-token output", f"at {n}-token outputs", "tok/s"
    if w == "concurrency":
        lens = {x.output_len for x in run.select("concurrency")}
        tail = f", {m.output_len}-token outputs" if len(lens) > 1 else ""
        return (
            f"C={m.concurrency} concurrent requests{tail}",
            f"at C={m.concurrency}{tail}",
            "aggregate tok/s",
        )
    c = ctx_name(m.context_tokens)
    if w == "long_context":
        return f"long context, {c} tokens", f"at {c} context", "tok/s"
    turns = getattr(m, "turns", None) or next(iter(re.findall(r"turns(\d+)", pid)), None)
    t = f", {turns} turns" if turns else ""
    return f"agentic prompt, {c} context{t}", f"at agentic {c} context{t}", "tok/s"


def _sort_key(w: WorkloadAdvice) -> tuple:
    order = {"decode": 0, "concurrency": 1, "long_context": 2, "agentic": 3}.get(w.kind, 4)
    return (order, w.concurrency or 0, w.context_tokens or 0, w.output_len or 0, w.id)


def _gap_for(m: Measurement, where: str, pid: str) -> Gap:
    reason = m.reason or "no reason given"
    if _CUT.search(reason):
        return Gap(
            "cut_by_context", f"{config_of(m).name} {where}: cut by the context window: {reason}", pid, m.key
        )
    return Gap(str(m.status), f"{config_of(m).name} {where}: {m.status}: {reason}", pid, m.key)


def _decide(w: WorkloadAdvice) -> None:
    b, r = w.best, w.runner_up
    if b is None:
        w.decision = NONE
        return
    if r is None:
        w.decision = SINGLE
        return
    w.margin = b.value - r.value
    sds = [p.noise.sd for p in (b, r) if p.noise.sd is not None]
    if not sds:
        w.decision = UNKNOWN
        return
    w.noise_sd = math.sqrt(sum(s * s for s in sds) / len(sds))
    srcs = sorted({p.noise.source for p in (b, r) if p.noise.sd is not None})
    w.noise_source = "/".join(srcs) + (
        "" if len(sds) == 2 else f" ({b.config.name if b.noise.sd else r.config.name} only)"
    )
    w.decision = CLEAR if w.margin > NOISE_K * w.noise_sd else WITHIN


def workload_points(run: Run, history: list[Run]) -> list[WorkloadAdvice]:
    groups: dict[str, list[Measurement]] = {}
    for m in run.measurements:
        groups.setdefault(point_id(m), []).append(m)
    out = []
    for pid, ms in groups.items():
        first = ms[0]
        title, where, unit = _titles(run, pid, first)
        ok = [m for m in ms if m.value is not None]
        ranking = sorted(
            (Point(config_of(m), m.key, m.value, point_noise(m, history), m.accept_len) for m in ok),
            key=lambda p: (
                -p.value,
                p.config.tp,
                method_order(p.config.label, p.config.method, p.config.budget),
            ),
        )
        w = WorkloadAdvice(
            id=pid,
            kind=str(first.workload),
            title=title,
            where=where,
            unit=unit,
            ranking=ranking,
            decision=NONE,
            output_len=first.output_len,
            concurrency=first.concurrency if first.workload == "concurrency" else None,
            context_tokens=first.context_tokens if first.workload in ("long_context", "agentic") else None,
        )
        w.gaps += [_gap_for(m, where, pid) for m in ms if not m.ok]
        _decide(w)
        out.append(w)
    return sorted(out, key=_sort_key)


# --- reasons ------------------------------------------------------------------------------------


def _gpu_set(run: Run, c: Config) -> tuple[int, ...] | None:
    srv = run.server_for(c.tp, c.label)
    g = srv.get("gpus") if srv else None
    if isinstance(g, list) and len(g) == c.tp and all(isinstance(x, int) for x in g):
        return tuple(sorted(g))
    return None


def _span(gpus: tuple[int, ...]) -> str:
    if gpus == tuple(range(gpus[0], gpus[-1] + 1)):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def _numa(run: Run, gpus: tuple[int, ...]) -> set[int] | None:
    numa = run.gpu_numa()
    nodes = {numa.get(g) for g in gpus}
    return None if None in nodes else nodes


def _tp_reasons(run: Run, w: WorkloadAdvice, fs: list[Finding], busbw: dict) -> list[str]:
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


def _memory_reason(run: Run, w: WorkloadAdvice, logs: Mapping[tuple[int, str], str]) -> list[str]:
    """Long context: the winner's KV cache spread over more GPUs, with the figures the run has."""
    b, r = w.best.config, w.runner_up.config
    if b.tp <= r.tp:
        return []
    mem = {g.get("index"): g.get("memory_mib") for g in run.facts.get("gpus") or [] if isinstance(g, dict)}
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


def _budget_reasons(run: Run, w: WorkloadAdvice) -> tuple[list[str], list[Gap]]:
    """Budgets of the winner's method compared at this point: the curve and where it was measured."""
    b = w.best.config
    if b.budget is None:
        return [], []
    same = [
        p for p in w.ranking if p.config.family == b.family and p.config.budget is not None
    ]  # measured here, any TP
    by_tp: dict[int, list[Point]] = {}
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


def _method_reason(w: WorkloadAdvice) -> list[str]:
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


def _finding_reasons(w: WorkloadAdvice, fs: list[Finding], ref: int | None) -> list[str]:
    b = w.best.config
    out = []
    for f in fs:
        n = f.numbers
        if (
            w.kind == "long_context"
            and f.id.startswith("long_context_")
            and n.get("context_tokens") == w.context_tokens
        ):
            out.append(f.text)
        elif (
            w.kind == "concurrency"
            and f.id == "concurrency_gain"
            and f"tp{b.tp}" in n
            and w.concurrency == max(v["c_high"] for v in n.values())
        ):
            if f.text.startswith(method_name(b.method, b.budget)):
                out.append(f.text)
        elif w.kind == "decode" and w.output_len == ref and f.id == "auto_flat":
            out.append(f.text)
        elif f.id == "acceptance_drift" and n.get("label") == b.label:
            out.append("caution: " + f.text)
    return out


# --- gaps across points -------------------------------------------------------------------------


def _contender_gaps(run: Run, points: list[WorkloadAdvice]) -> None:
    """Each point: the configurations that win elsewhere but were not tried here. Winners count
    from points that compared TP sizes (a TP1-only point says nothing about TP4), or from every
    point when none did."""
    ranked = [w for w in points if w.best is not None]
    across = [w for w in ranked if len({p.config.tp for p in w.ranking}) > 1]  # TP decided here
    winners = list(dict.fromkeys(w.best.config for w in (across or ranked)))
    for w in points:
        tried = {(m.tp, m.label) for m in run.measurements if point_id(m) == w.id}
        missing = [c for c in winners if (c.tp, c.label) not in tried]
        if missing:
            w.gaps.append(
                Gap(
                    "not_measured",
                    f"{' and '.join(c.name for c in missing)} {w.where} not measured",
                    w.id,
                )
            )


def _noise_gaps(w: WorkloadAdvice) -> None:
    b, r = w.best, w.runner_up
    if w.decision == WITHIN:
        w.gaps.append(
            Gap(
                "within_noise",
                f"{b.config.name} vs {r.config.name} {w.where}: the margin is inside the noise; a run with "
                "more repetitions (gpubox_bench.repetitions) would decide",
                w.id,
            )
        )
    elif w.decision == UNKNOWN:
        w.gaps.append(
            Gap(
                "noise_unknown",
                f"{b.config.name} vs {r.config.name} {w.where}: noise unknown; a run with 3 or more "
                "repetitions, or earlier runs in the box's history, would tell",
                w.id,
            )
        )


# --- the serving plan ---------------------------------------------------------------------------


def _evidence(w: WorkloadAdvice, against: Config | None = None) -> str:
    """'1024-token output: 281.1 vs 263.9 tok/s TP8 DDTree b15, exceeds the noise'."""
    b = w.best
    r = next((p for p in w.ranking if p.config == against), None) if against else w.runner_up
    if r is None:
        return f"{w.title}: {f1(b.value)} {w.unit}, no runner-up"
    ratio = (
        f"{b.value / r.value:.1f}x"
        if r.value and b.value / r.value >= 1.5
        else f"{(b.value / r.value - 1) * 100:+.1f}%"
    )
    if r is not w.runner_up:
        word = "vs the default"
        return f"{w.title}: {f1(b.value)} vs {f1(r.value)} {w.unit} ({ratio}, {word} {r.config.name})"
    word = {CLEAR: "exceeds the noise", WITHIN: "inside the noise", UNKNOWN: "noise unknown"}[w.decision]
    return f"{w.title}: {f1(b.value)} vs {f1(r.value)} {w.unit} {r.config.name} ({ratio}, {word})"


def _against_decided(w: WorkloadAdvice, default: Config) -> bool:
    """Does the winner beat the default here by more than the noise?"""
    d = next((p for p in w.ranking if p.config == default), None)
    b = w.best
    sds = [s for s in (b.noise.sd, d.noise.sd) if s is not None] if d is not None else []
    if not sds:
        return False
    pooled = math.sqrt(sum(s * s for s in sds) / len(sds))
    return b.value - d.value > NOISE_K * pooled


def _range(vals: list[int]) -> str:
    vals = sorted(set(vals))
    return str(vals[0]) if len(vals) == 1 else f"{vals[0]}-{vals[-1]}"


def plan(run: Run, points: list[WorkloadAdvice]) -> tuple[list[PlanRow], list[Gap]]:
    ref = ref_len(run)
    ranked = [w for w in points if w.best is not None]
    base = next((w for w in ranked if w.kind == "decode" and w.output_len == ref), None)
    base = (
        base or next((w for w in ranked if w.kind == "concurrency"), None) or (ranked[0] if ranked else None)
    )
    if base is None:
        return [], []
    default = base.best.config
    won: list[WorkloadAdvice] = []
    lost: list[WorkloadAdvice] = []
    for w in ranked:
        if w is base:
            continue
        if w.best.config == default:
            if w.runner_up is not None:  # measured alone it beat nothing: no claim, a gap names the rest
                won.append(w)
        elif any(p.config == default for p in w.ranking):
            lost.append(w)
    when = ["default"]
    single = [w.output_len for w in [base, *won] if w.kind == "decode"]
    if single:
        when.append(f"single requests ({'/'.join(map(str, sorted(set(single))))}-token outputs)")
    conc = [w.concurrency for w in won if w.kind == "concurrency"]
    if conc:
        when.append(f"concurrency C={_range(conc)}")
    ctxs = [w.context_tokens for w in won if w.kind in ("long_context", "agentic")]
    if ctxs:
        when.append(f"context up to {ctx_name(max(ctxs))} tokens")
    rows = [
        PlanRow(
            when[0] + ": " + ", ".join(when[1:]) if len(when) > 1 else when[0],
            default,
            _evidence(base),
            base.decision == CLEAR,
            [base.id, *(w.id for w in won)],
        )
    ]
    gaps: list[Gap] = []
    # switches: the default measured and beaten; one row per (kind, new config), from the
    # smallest point where it wins
    by: dict[tuple[str, Config], list[WorkloadAdvice]] = {}
    for w in lost:
        kind = "context" if w.kind in ("long_context", "agentic") else w.kind
        by.setdefault((kind, w.best.config), []).append(w)
    for (kind, cfg), ws in by.items():
        ws = sorted(ws, key=_sort_key)
        if kind == "context":
            th = min(w.context_tokens or 0 for w in ws)
            when_txt = f"prompts of {ctx_name(th)} tokens or more"
            shorter = [
                w.context_tokens
                for w in won
                if w.context_tokens and w.context_tokens < th and any(p.config == cfg for p in w.ranking)
            ]
            if shorter:
                when_txt += f" (the default still wins at {ctx_name(max(shorter))})"
            else:
                gaps.append(
                    Gap(
                        "not_measured",
                        f"the context threshold for {cfg.name}: {default.name} vs {cfg.name} not compared below "
                        f"{ctx_name(th)} context (a long-context run at shorter prompts would place it)",
                    )
                )
        elif kind == "concurrency":
            when_txt = f"concurrency C={min(w.concurrency or 0 for w in ws)} or more"
        else:
            when_txt = f"outputs of {min(w.output_len or 0 for w in ws)} tokens or more"
        rows.append(
            PlanRow(
                when_txt,
                cfg,
                "; ".join(_evidence(w, default) for w in ws),
                all(_against_decided(w, default) for w in ws),
                [w.id for w in ws],
            )
        )
    return rows, gaps


# --- the whole advice ---------------------------------------------------------------------------


def _as_run(h: dict | Run) -> Run | None:
    """A history entry as a Run; a damaged one is left out (it may cost the noise estimate, never
    the advice)."""
    if isinstance(h, Run):
        return h
    try:
        return from_doc(h, "<history>", "history")
    except GpuboxError:
        return None


def advise(
    run: Run,
    history: Iterable[dict | Run] = (),
    probe: Mapping[str, Any] | None = None,
    logs: Mapping[tuple[int, str], str] | None = None,
) -> Advice:
    """Advice for one run. history: the box's earlier result documents (or Runs), oldest first;
    probe: a gpubox.probe/1 document of the same box; logs: server log text by (tp, label)."""
    hist = [
        h for h in map(_as_run, history) if h is not None and h.doc.get("run_id") != run.doc.get("run_id")
    ]
    points = workload_points(run, hist)
    fs = run_findings([run])
    notes = []
    if probe is not None and (why := probe_mismatch(run, probe)):
        notes.append(f"the probe's all-reduce figures are not used: it is of other GPUs ({why})")
        probe = None
    ref, busbw, logs = ref_len(run), allreduce_busbw(probe), logs or {}
    for w in points:
        if w.best is None:
            continue
        if w.runner_up is not None:
            w.reasons += _tp_reasons(run, w, fs, busbw)
            if w.kind == "long_context":
                w.reasons += _memory_reason(run, w, logs)
        w.reasons += _method_reason(w)
        br, bg = _budget_reasons(run, w)
        w.reasons += br
        w.gaps += bg
        w.reasons += _finding_reasons(w, fs, ref)
        w.reasons = list(dict.fromkeys(w.reasons))
        _noise_gaps(w)
    _contender_gaps(run, points)
    for w in points:
        if w.best is None and not w.gaps:
            w.gaps.append(Gap("not_measured", f"no configuration measured {w.where}", w.id))
    rows, plan_gaps = plan(run, points)
    served = {(m.tp, m.label) for m in run.measurements}
    server_gaps = [
        Gap(
            str(s.get("status")),
            f"TP{s.get('tp')} {s.get('label')} server {s.get('status')}: {s.get('error') or 'no reason given'}",
        )
        for s in run.servers
        if s.get("status") in ("failed", "skipped") and (s.get("tp"), s.get("label")) not in served
    ]
    gaps = list(
        {g.text: g for g in [*(g for w in points for g in w.gaps), *plan_gaps, *server_gaps]}.values()
    )
    return Advice(run.name, run.box, bool(run.doc.get("simulated")), points, rows, gaps, notes=notes)


def advise_all(
    runs: list[Run],
    history: Mapping[str, list[dict]] | None = None,
    probe: Mapping[str, Any] | None = None,
    logs: Mapping[str, Mapping[tuple[int, str], str]] | None = None,
) -> list[Advice]:
    """One Advice per run; history by box name, logs by run name."""
    return [advise(r, (history or {}).get(r.box, ()), probe, (logs or {}).get(r.name)) for r in runs]
