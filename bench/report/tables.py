"""Report tables as plain data (cells with a status), so LaTeX, Markdown and HTML render the same
content and tests can check it without parsing any of them.

A cell is a number, or says why there is none: `failed` / `skipped` (the run tried; the reason goes
into the table's notes) or `missing` (the run did not include that point). Never a zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .data import Measurement, ResultDoc, method_name
from .observations import ctx_name, deltas, describe, ref_len

MISSING_TEXT = "--"  # renderers turn this into an en dash


@dataclass
class Cell:
    text: str
    status: str = "ok"  # ok | failed | skipped | missing | label
    value: float | None = None

    @classmethod
    def label(cls, text: str) -> "Cell":
        return cls(str(text), "label")

    def to_dict(self) -> dict:
        return {"text": self.text, "status": self.status, "value": self.value}


@dataclass
class Table:
    id: str
    title: str
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    caption: str = ""

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "title": self.title,
            "columns": self.columns,
            "caption": self.caption,
            "rows": [[c.to_dict() for c in r] for r in self.rows],
            "notes": self.notes,
        }

    def cell(self, row_label: str, column: str) -> Cell:
        """The cell in the row whose first label cells join to `row_label` (tests, findings)."""
        j = self.columns.index(column)
        for r in self.rows:
            labels = " ".join(c.text for c in r if c.status == "label")
            if labels == row_label:
                return r[j]
        raise KeyError(row_label)


def fmt(v: float, digits: int = 1) -> str:
    return f"{v:,.{digits}f}"


def mcell(m: Measurement | None, notes: list[str], digits: int = 1, accept: bool = False) -> Cell:
    """A measurement as a cell; failed/skipped add their reason to the table notes."""
    if m is None:
        return Cell(MISSING_TEXT, "missing")
    if not m.ok:
        notes.append(f"{m.key}: {m.status}: {m.reason or 'no reason given'}")
        return Cell(m.status, m.status)
    v = m.accept_len if accept else m.value
    if v is None:
        return Cell("n/a" if accept else MISSING_TEXT, "missing")
    return Cell(fmt(v, digits), "ok", v)


def _prefix(runs: list[ResultDoc], r: ResultDoc) -> list[Cell]:
    return [Cell.label(r.name)] if len(runs) > 1 else []


def _cols(runs: list[ResultDoc], *names: str) -> list[str]:
    return (["run"] if len(runs) > 1 else []) + list(names)


def tp_scaling(runs: list[ResultDoc]) -> Table | None:
    all_tp = sorted({m.tp for r in runs for m in r.select("decode")})
    if not all_tp:
        return None
    lens = {r.name: ref_len(r) for r in runs}
    L = sorted({v for v in lens.values() if v})
    t = Table(
        "tp_scaling",
        "TP scaling: decode tok/s",
        _cols(runs, "method", *[f"TP{tp}" for tp in all_tp]),
        caption=f"Median per-request decode tok/s at {'/'.join(map(str, L)) or '?'} output tokens, batch 1.",
    )
    for r in runs:
        for lab, meth, bud in r.labels("decode"):
            cells = [
                mcell(r.get("decode", tp=tp, label=lab, output_len=lens[r.name]), t.notes) for tp in all_tp
            ]
            if all(c.status == "missing" for c in cells):
                continue
            t.rows.append(_prefix(runs, r) + [Cell.label(method_name(meth, bud))] + cells)
    return t if t.rows else None


def method_by_length(runs: list[ResultDoc]) -> list[Table]:
    """Method x output length, one table per TP that has more than one output length."""
    out = []
    for tp in sorted({m.tp for r in runs for m in r.select("decode")}):
        lens = sorted({m.output_len for r in runs for m in r.select("decode", tp=tp) if m.output_len})
        if len(lens) < 2:
            continue
        t = Table(
            f"method_length_tp{tp}",
            f"Method x output length at TP{tp}: decode tok/s",
            _cols(runs, "method", *[f"{n} tok" for n in lens], "vs auto"),
            caption=f"Speed-up over auto at the same TP and {_ref_lens(runs)} output tokens in the last column.",
        )
        for r in runs:
            L = ref_len(r)
            auto = next((lab for lab, meth, _ in r.labels("decode") if str(meth).lower() == "auto"), None)
            base = r.get("decode", tp=tp, label=auto, output_len=L) if auto else None
            for lab, meth, bud in r.labels("decode"):
                ms = [r.get("decode", tp=tp, label=lab, output_len=n) for n in lens]
                if sum(m is not None for m in ms) < 2:
                    continue
                cells = [mcell(m, t.notes) for m in ms]
                me = r.get("decode", tp=tp, label=lab, output_len=L)
                if base is not None and base.value and me is not None and me.value is not None:
                    x = Cell(f"{me.value / base.value:.1f}x", "ok", me.value / base.value)
                else:
                    x = Cell(MISSING_TEXT, "missing")
                t.rows.append(_prefix(runs, r) + [Cell.label(method_name(meth, bud))] + cells + [x])
        if t.rows:
            out.append(t)
    return out


def _ref_lens(runs: list[ResultDoc]) -> str:
    return "/".join(str(v) for v in sorted({ref_len(r) for r in runs if ref_len(r)})) or "?"


def concurrency(runs: list[ResultDoc]) -> Table | None:
    cs = sorted({m.concurrency for r in runs for m in r.select("concurrency") if m.concurrency})
    if not cs:
        return None
    t = Table(
        "concurrency",
        "Concurrency sweep: aggregate tok/s",
        _cols(runs, "method", "TP", *[f"C={c}" for c in cs], "gain"),
        caption="Sum of output tokens over wall time with C requests in flight; gain = highest C over lowest.",
    )
    for r in runs:
        for lab, meth, bud in r.labels("concurrency"):
            for tp in sorted({m.tp for m in r.select("concurrency", label=lab)}):
                ms = {c: r.get("concurrency", tp=tp, label=lab, concurrency=c) for c in cs}
                cells = [mcell(ms[c], t.notes) for c in cs]
                okc = [c for c in cs if ms[c] is not None and ms[c].value is not None]
                gain = (
                    Cell(
                        f"{ms[okc[-1]].value / ms[okc[0]].value:.1f}x",
                        "ok",
                        ms[okc[-1]].value / ms[okc[0]].value,
                    )
                    if len(okc) >= 2
                    else Cell(MISSING_TEXT, "missing")
                )
                t.rows.append(
                    _prefix(runs, r)
                    + [Cell.label(method_name(meth, bud)), Cell.label(f"TP{tp}")]
                    + cells
                    + [gain]
                )
    return t if t.rows else None


def long_context(runs: list[ResultDoc]) -> Table | None:
    ms_all = [m for r in runs for w in ("long_context", "agentic") for m in r.select(w)]
    if not ms_all:
        return None
    all_tp = sorted({m.tp for m in ms_all})
    t = Table(
        "long_context",
        "Long context: generation tok/s",
        _cols(runs, "method", "workload", "context", *[f"TP{tp}" for tp in all_tp]),
        caption="Decode tok/s after a prompt of the given length (prompt sized in tokens with /tokenize).",
    )
    for r in runs:
        keys = sorted(
            {
                (m.workload, m.label, m.method, m.budget, m.context_tokens or 0)
                for w in ("long_context", "agentic")
                for m in r.select(w)
            },
            key=lambda k: (k[0] != "long_context", k[1], k[4]),
        )
        for w, lab, meth, bud, ctx in keys:
            cells = [mcell(r.get(w, tp=tp, label=lab, context_tokens=ctx or None), t.notes) for tp in all_tp]
            t.rows.append(
                _prefix(runs, r)
                + [
                    Cell.label(method_name(meth, bud)),
                    Cell.label(w.replace("_", " ")),
                    Cell.label(ctx_name(ctx)),
                ]
                + cells
            )
    return t if t.rows else None


def acceptance(runs: list[ResultDoc]) -> Table | None:
    all_tp = sorted({m.tp for r in runs for m in r.select("decode") if m.accept_len is not None})
    if not all_tp:
        return None
    t = Table(
        "acceptance",
        "Acceptance length (mean accepted tokens per step)",
        _cols(runs, "method", *[f"TP{tp}" for tp in all_tp]),
        caption="1 + accepted/drafts from the server's spec-decode counters, decode workload; "
        "it should not change with TP.",
    )
    for r in runs:
        L = ref_len(r)
        for lab, meth, bud in r.labels("decode"):
            if str(meth).lower() == "auto":
                continue
            cells = []
            for tp in all_tp:
                m = r.get("decode", tp=tp, label=lab, output_len=L)
                if m is None or (m.ok and m.accept_len is None):
                    m = next((x for x in r.select("decode", tp=tp, label=lab) if x.accept_len is not None), m)
                cells.append(mcell(m, [], digits=2, accept=True))
            if all(c.status == "missing" for c in cells):
                continue
            t.rows.append(_prefix(runs, r) + [Cell.label(method_name(meth, bud))] + cells)
    return t if t.rows else None


def not_measured(runs: list[ResultDoc]) -> Table | None:
    t = Table(
        "not_measured",
        "Not measured",
        _cols(runs, "measurement", "status", "reason"),
        caption="Measurements that failed or were skipped; their figures are absent, never zero.",
    )
    for r in runs:
        for m in r.measurements:
            if not m.ok:
                t.rows.append(
                    _prefix(runs, r)
                    + [
                        Cell.label(m.key),
                        Cell(m.status, m.status),
                        Cell(m.reason or "no reason given", "label"),
                    ]
                )
    return t if t.rows else None


def comparison(base: ResultDoc, new: ResultDoc) -> Table | None:
    """Every key of either run side by side with the change (the seed's before/after table)."""
    a = {m.key: m for m in base.measurements}
    b = {m.key: m for m in new.measurements}
    keys = [m.key for m in base.measurements] + [k for k in b if k not in a]
    if not keys:
        return None
    t = Table(
        f"compare_{base.name}_{new.name}",
        f"{new.name} vs {base.name}",
        ["measurement", base.name, new.name, "change"],
        caption="tok/s (aggregate for concurrency); change = new over base.",
    )
    notes: list[str] = []
    for k in keys:
        ma, mb = a.get(k), b.get(k)
        m = mb or ma
        ca, cb = mcell(ma, notes), mcell(mb, notes)
        if ca.value is not None and cb.value is not None and ca.value:
            d = (cb.value - ca.value) / ca.value * 100
            ch = Cell(f"{d:+.1f}%", "ok", d)
        else:
            ch = Cell(MISSING_TEXT, "missing")
        t.rows.append([Cell.label(describe(m)), ca, cb, ch])
    t.notes = notes
    return t


def all_tables(runs: list[ResultDoc]) -> list[Table]:
    ts: list[Table | None] = [
        tp_scaling(runs),
        *method_by_length(runs),
        concurrency(runs),
        long_context(runs),
        acceptance(runs),
        not_measured(runs),
    ]
    return [t for t in ts if t is not None]


__all__ = ["Cell", "Table", "all_tables", "comparison", "deltas"]
