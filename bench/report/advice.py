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

import math
import re
from typing import Any, Iterable, Mapping

from gpubox.errors import GpuboxError

from .advice_evidence import (
    ReasonIndex,
    allreduce_busbw,
    budget_reasons,
    finding_reasons,
    kv_cache,
    memory_reason,
    method_reason,
    probe_mismatch,
    tp_reasons,
)
from .advice_model import (
    CLEAR,
    NOISE_K,
    NONE,
    RULE,
    SINGLE,
    UNKNOWN,
    WITHIN,
    Advice,
    Candidate,
    Config,
    Gap,
    Noise,
    PlanRow,
    WorkloadAdvice,
    order_key,
)
from .advice_noise import d2, point_noise
from .advice_plan import plan
from .data import Measurement, ResultDoc, from_doc, method_order
from .observations import ctx_name, ref_len
from .observations import observations as run_observations

__all__ = [
    "CLEAR",
    "NONE",
    "NOISE_K",
    "RULE",
    "SINGLE",
    "UNKNOWN",
    "WITHIN",
    "Advice",
    "Config",
    "Gap",
    "Noise",
    "PlanRow",
    "Candidate",
    "WorkloadAdvice",
    "advise",
    "advise_all",
    "allreduce_busbw",
    "d2",
    "kv_cache",
    "plan",
]

# a reason that names the context limit: gpubox's own refusal (ContextTooLong: "... exceeds the
# server's max_model_len ..."), vLLM's HTTP 400 ("This model's maximum context length is ...") and
# its scheduler ("Input prompt (N tokens) is too long and exceeds limit of M"). A bare HTTP 400 is
# not enough: servers answer 400 for other reasons too (rejected sampling fields).
_CUT = re.compile(r"max_model_len|max-model-len|context (window|length)|too long and exceeds limit", re.I)


def point_id(m: Measurement) -> str:
    """The key without its tp<N>/<label>/ prefix: the same workload point across configurations."""
    parts = str(m.key).split("/", 2)
    return parts[2] if len(parts) == 3 else f"{m.workload}/{m.output_len}/{m.concurrency}/{m.context_tokens}"


def config_of(m: Measurement) -> Config:
    return Config(m.tp, str(m.label), m.method, m.budget)


def _lens(run: ResultDoc) -> tuple[list, set]:
    """The decode output lengths (sorted) and the concurrency output lengths of a run: read once
    per run, not once per point (a point per measurement made that quadratic)."""
    decode, conc = set(), set()
    for x in run.measurements:
        if x.workload == "decode" and x.output_len:
            decode.add(x.output_len)
        elif x.workload == "concurrency":
            conc.add(x.output_len)
    return sorted(decode, key=_order), conc


def _order(v):
    """A sort key for values of mixed type from documents (ints first, then the rest as text)."""
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def _titles(
    run: ResultDoc, pid: str, m: Measurement, lens_of: tuple[list, set] | None = None
) -> tuple[str, str, str]:
    """(title, 'at ...' phrase, unit) of a workload point."""
    w = m.workload
    decode_lens, conc_lens = lens_of or _lens(run)
    if w == "decode":
        lens = decode_lens
        n = m.output_len
        kind = "single request"
        if len(lens) > 1 and n == lens[0]:
            kind = "short single request"
        elif len(lens) > 1 and n == lens[-1]:
            kind = "long decode"
        return f"{kind}, {n}-token output", f"at {n}-token outputs", "tok/s"
    if w == "concurrency":
        tail = f", {m.output_len}-token outputs" if len(conc_lens) > 1 else ""
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


def workload_points(run: ResultDoc, history: list[ResultDoc]) -> list[WorkloadAdvice]:
    groups: dict[str, list[Measurement]] = {}
    for m in run.measurements:
        groups.setdefault(point_id(m), []).append(m)
    out = []
    lens_of = _lens(run)
    for pid, ms in groups.items():
        first = ms[0]
        title, where, unit = _titles(run, pid, first, lens_of)
        ok = [m for m in ms if m.value is not None]
        ranking = sorted(
            (Candidate(config_of(m), m.key, m.value, point_noise(m, history), m.accept_len) for m in ok),
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
    return sorted(out, key=order_key)


def _contender_gaps(run: ResultDoc, points: list[WorkloadAdvice]) -> None:
    """Each point: the configurations that win elsewhere but were not tried here. Winners count
    from points that compared TP sizes (a TP1-only point says nothing about TP4), or from every
    point when none did."""
    ranked = [w for w in points if w.best is not None]
    across = [w for w in ranked if len({p.config.tp for p in w.ranking}) > 1]  # TP decided here
    winners = list(dict.fromkeys(w.best.config for w in (across or ranked)))
    wanted: dict[tuple, int] = {}  # (tp, label) -> how many winners carry it
    for c in winners:
        wanted[(c.tp, c.label)] = wanted.get((c.tp, c.label), 0) + 1
    tried_at: dict[str, set] = {}
    for m in run.measurements:  # one pass: each point's tried configurations
        tried_at.setdefault(point_id(m), set()).add((m.tp, m.label))
    for w in points:
        tried = tried_at.get(w.id, set())
        n_missing = len(winners) - sum(wanted.get(t, 0) for t in tried)
        if not n_missing:
            continue
        # the first few by name: scanning stops after them (each skipped winner is a tried one)
        shown = []
        for c in winners:
            if (c.tp, c.label) not in tried:
                shown.append(c.name)
                if len(shown) == _MAX_NAMED:
                    break
        more = f" and {n_missing - len(shown)} more" if n_missing > len(shown) else ""
        w.gaps.append(Gap("not_measured", f"{' and '.join(shown)}{more} {w.where} not measured", w.id))


_MAX_NAMED = 5  # winners named in one gap; a run of thousands of configurations stays readable


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


def _as_run(h: dict | ResultDoc) -> ResultDoc | None:
    """A history entry as a ResultDoc; a damaged one is left out (it may cost the noise estimate, never
    the advice)."""
    if isinstance(h, ResultDoc):
        return h
    try:
        return from_doc(h, "<history>", "history")
    except GpuboxError:
        return None


def advise(
    run: ResultDoc,
    history: Iterable[dict | ResultDoc] = (),
    probe: Mapping[str, Any] | None = None,
    logs: Mapping[tuple[int, str], str] | None = None,
) -> Advice:
    """Advice for one run. history: the box's earlier result documents (or Runs), oldest first;
    probe: a gpubox.probe/1 document of the same box; logs: server log text by (tp, label)."""
    hist = [h for h in map(_as_run, history) if h is not None and h.result.run_id != run.result.run_id]
    points = workload_points(run, hist)
    fs = run_observations([run])
    notes = []
    if probe is not None and (why := probe_mismatch(run, probe)):
        notes.append(f"the probe's all-reduce figures are not used: it is of other GPUs ({why})")
        probe = None
    ref, busbw, logs = ref_len(run), allreduce_busbw(probe), logs or {}
    reasons_of = ReasonIndex(fs)  # once per run: a point looks only at the findings it can use
    for w in points:
        if w.best is None:
            continue
        if w.runner_up is not None:
            w.reasons += tp_reasons(run, w, fs, busbw)
            if w.kind == "long_context":
                w.reasons += memory_reason(run, w, logs)
        w.reasons += method_reason(w)
        br, bg = budget_reasons(run, w)
        w.reasons += br
        w.gaps += bg
        w.reasons += finding_reasons(w, reasons_of, ref)
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
            str(s.status),
            f"TP{s.tp} {s.label} server {s.status}: {s.error or 'no reason given'}",
        )
        for s in run.servers
        if s.status in ("failed", "skipped") and (s.tp, s.label) not in served
    ]
    gaps = list(
        {g.text: g for g in [*(g for w in points for g in w.gaps), *plan_gaps, *server_gaps]}.values()
    )
    return Advice(run.name, run.box, bool(run.result.simulated), points, rows, gaps, notes=notes)


def advise_all(
    runs: list[ResultDoc],
    history: Mapping[str, list[dict]] | None = None,
    probe: Mapping[str, Any] | None = None,
    logs: Mapping[str, Mapping[tuple[int, str], str]] | None = None,
) -> list[Advice]:
    """One Advice per run; history by box name, logs by run name."""
    return [advise(r, (history or {}).get(r.box, ()), probe, (logs or {}).get(r.name)) for r in runs]
