"""The advice as data: configurations, noise estimates, ranked points per workload, gaps, the
serving plan. advice.py fills these from a run; renderers (advice_render.py, templates/_advice.*)
only lay them out, so every format says the same thing."""

from __future__ import annotations

from dataclasses import dataclass, field

from .data import method_name
from .observations import f1

NOISE_K = 2.0
MIN_HISTORY = 3  # earlier healthy runs needed for a history noise estimate
HISTORY_RUNS = 10  # at most this many of the newest earlier runs
RULE = (
    f"a margin is larger than the noise when it exceeds {NOISE_K:g} x the pooled standard deviation "
    "of one figure; the standard deviation comes from the run's repetitions (min/max spread / d2(n)) "
    f"or from the box's earlier healthy runs (at least {MIN_HISTORY}), the larger when both exist; "
    "without either the noise is unknown"
)

# decision states of one workload point
CLEAR, WITHIN, UNKNOWN, SINGLE, NONE = "clear", "within_noise", "noise_unknown", "single", "none"


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
class Candidate:
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
    ranking: list[Candidate]
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
    def best(self) -> Candidate | None:
        return self.ranking[0] if self.ranking else None

    @property
    def runner_up(self) -> Candidate | None:
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


def order_key(w: "WorkloadAdvice") -> tuple:
    """Workloads in reading order: decode, concurrency, long context, agentic; then by size."""
    order = {"decode": 0, "concurrency": 1, "long_context": 2, "agentic": 3}.get(w.kind, 4)
    return (order, w.concurrency or 0, w.context_tokens or 0, w.output_len or 0, w.id)
