"""The advice document (`gpubox advise --json`): `{"advice": [Advice...], "exit_code": N}`, written,
checked and read through one class, `AdviceDocument`.

The advice objects (advice_model.py) write themselves (`to_dict`); reading builds the same objects
back, every stored field checked (gpubox.docmodel: one line naming the field, exit 2), so
`AdviceDocument.from_json(text).to_json() == text` for what gpubox wrote. Figures that follow from
others (a configuration's name, the best and runner-up points, margins in percent, the one-line
verdict, whether the plan is decided, the exit status) are recomputed, not read: a document whose
stored copy disagrees with them is refused, naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpubox.docmodel import Problem, convert, join
from gpubox.errors import GpuboxError

from .advice_model import (
    CLEAR,
    NOISE_K,
    NONE,
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
)

DECISIONS = (CLEAR, WITHIN, UNKNOWN, SINGLE, NONE)
FIX = "give the output of `gpubox advise --json`"


class AdviceError(GpuboxError):
    """An advice document that breaks its shape (exit 2, names the file and the field)."""


def _get(d: Any, key: str, sp: Any, path: str) -> Any:
    if not isinstance(d, dict):
        raise Problem(f"{path or '(document)'}: expected an object")
    if key not in d:
        raise Problem(f"{join(path, key)}: missing")
    return convert(d[key], sp, join(path, key))


def _same(d: dict, key: str, want: Any, path: str) -> None:
    """A stored derived figure must be what the other fields give."""
    if d.get(key) != want:
        raise Problem(f"{join(path, key)}: {d.get(key)!r} does not follow from the document ({want!r})")


def config(d: Any, path: str) -> Config:
    c = Config(
        _get(d, "tp", "posint", path),
        _get(d, "label", "str", path),
        _get(d, "method", "str?", path),
        _get(d, "budget", "int?", path),
    )
    _same(d, "name", c.name, path)
    return c


def noise(d: Any, path: str) -> Noise:
    return Noise(
        _get(d, "sd", "number?", path), _get(d, "source", "str", path), _get(d, "detail", "str", path)
    )


def candidate(d: Any, path: str) -> Candidate:
    return Candidate(
        config(_get(d, "config", ("map", None), path), join(path, "config")),
        _get(d, "key", "str", path),
        _get(d, "value", "number", path),
        noise(_get(d, "noise", ("map", None), path), join(path, "noise")),
        _get(d, "accept_len", "number?", path),
    )


def gap(d: Any, path: str) -> Gap:
    return Gap(
        _get(d, "kind", "str", path),
        _get(d, "text", "str", path),
        _get(d, "workload", "str?", path),
        _get(d, "key", "str?", path),
    )


def workload(d: Any, path: str) -> WorkloadAdvice:
    ranking = _get(d, "ranking", ("list", ("map", None)), path)
    gaps = _get(d, "gaps", ("list", ("map", None)), path)
    w = WorkloadAdvice(
        id=_get(d, "id", "str", path),
        kind=_get(d, "kind", "str", path),
        title=_get(d, "title", "str", path),
        where="",  # a phrase for sentences, not stored
        unit=_get(d, "unit", "str", path),
        ranking=[candidate(p, f"{path}.ranking[{i}]") for i, p in enumerate(ranking)],
        decision=_get(d, "decision", ("enum", DECISIONS), path),
        margin=_get(d, "margin", "number?", path),
        noise_sd=_get(d, "noise_sd", "number?", path),
        noise_source=_get(d, "noise_source", "str", path),
        output_len=_get(d, "output_len", "int?", path),
        concurrency=_get(d, "concurrency", "int?", path),
        context_tokens=_get(d, "context_tokens", "int?", path),
        reasons=_get(d, "reasons", ("list", "str"), path),
        gaps=[gap(g, f"{path}.gaps[{i}]") for i, g in enumerate(gaps)],
    )
    if w.decision in (CLEAR, WITHIN) and (w.noise_sd is None or w.margin is None or w.runner_up is None):
        raise Problem(
            f"{join(path, 'decision')}: {w.decision} without a margin, a runner-up and a noise figure"
        )
    if w.runner_up is not None and (w.margin is None or not w.runner_up.value):
        raise Problem(
            f"{join(path, 'margin')}: a runner-up needs a margin and a runner-up figure other than 0"
        )
    out = w.to_dict()
    for k in ("best", "runner_up", "margin_pct", "exceeds_noise", "verdict"):
        _same(d, k, out[k], path)
    return w


def plan_row(d: Any, path: str) -> PlanRow:
    return PlanRow(
        _get(d, "when", "str", path),
        config(_get(d, "config", ("map", None), path), join(path, "config")),
        _get(d, "evidence", "str", path),
        _get(d, "decided", "bool", path),
        _get(d, "workloads", ("list", "str"), path),
    )


def advice(d: Any, path: str) -> Advice:
    a = Advice(
        run=_get(d, "run", "str", path),
        box=_get(d, "box", "str", path),
        simulated=_get(d, "simulated", "bool", path),
        workloads=[
            workload(w, f"{join(path, 'workloads')}[{i}]")
            for i, w in enumerate(_get(d, "workloads", ("list", ("map", None)), path))
        ],
        plan=[
            plan_row(r, f"{join(path, 'plan')}[{i}]")
            for i, r in enumerate(_get(d, "plan", ("list", ("map", None)), path))
        ],
        gaps=[
            gap(g, f"{join(path, 'gaps')}[{i}]")
            for i, g in enumerate(_get(d, "gaps", ("list", ("map", None)), path))
        ],
        rule=_get(d, "rule", "str", path),
        notes=_get(d, "notes", ("list", "str"), path),
    )
    _same(d, "noise_k", NOISE_K, path)
    _same(d, "decided", a.decided, path)
    _same(d, "exit_code", a.exit_code, path)
    return a


@dataclass
class AdviceDocument:
    """What `gpubox advise --json` prints: the advice per run and the command's exit status."""

    advice: list[Advice] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """1 when any run's advice has problems left (advice_model.Advice.exit_code), else 0."""
        return max((a.exit_code for a in self.advice), default=0)

    def to_dict(self) -> dict[str, Any]:
        return {"advice": [a.to_dict() for a in self.advice], "exit_code": self.exit_code}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False, default=str) + "\n"

    @classmethod
    def from_dict(cls, d: Any) -> AdviceDocument:
        items = _get(d, "advice", ("list", ("map", None)), "")
        doc = cls([advice(a, f"advice[{i}]") for i, a in enumerate(items)])
        _same(d, "exit_code", doc.exit_code, "")
        return doc

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "advice") -> AdviceDocument:
        """Parse and check an advice document; AdviceError naming WHERE and the field."""
        from ..result_read import parse

        try:
            v = parse(text, where)
        except GpuboxError as exc:
            raise AdviceError(exc.problem, FIX) from None
        try:
            return cls.from_dict(v)
        except Problem as exc:
            raise AdviceError(f"{where}: {exc}", FIX) from None
