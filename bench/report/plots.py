"""Report figures with matplotlib (Agg: no display needed). PDF for LaTeX (vector), PNG for
Markdown/HTML. Each plot is drawn only when the runs hold data for it; only `ok` points are drawn,
so a failed measurement leaves a gap instead of a fake zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: reports are made on headless boxes and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from .data import ResultDoc, method_name  # noqa: E402
from .observations import ctx_name, deltas, describe, ref_len  # noqa: E402

STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]
# fixed colours per method family so a method looks the same in every figure
FAMILY_COLOURS = {"auto": "#7f7f7f", "DFlash": "#1f77b4", "DDTree": "#d62728"}
HATCHES = ["", "///", "...", "xxx"]  # run 1, 2, ... in multi-run bar charts
EXTRA = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e"]


@dataclass
class Figure:
    id: str
    title: str
    caption: str
    path: Path


class _Palette:
    """Stable colour per method name across one report."""

    def __init__(self):
        self.seen: dict[str, str] = {}
        self.family_count: dict[str, int] = {}

    def marker(self, name: str) -> str:
        self(name)
        return MARKERS[list(self.seen).index(name) % len(MARKERS)]

    def __call__(self, name: str) -> str:
        if name not in self.seen:
            fam = name.split(" ")[0]
            k = self.family_count.get(fam, 0)
            self.family_count[fam] = k + 1
            if k == 0 and fam in FAMILY_COLOURS:
                self.seen[name] = FAMILY_COLOURS[fam]
            else:
                self.seen[name] = EXTRA[(len(self.seen)) % len(EXTRA)]
        return self.seen[name]


def _series_name(runs: list[ResultDoc], r: ResultDoc, name: str) -> str:
    """A legend entry: text from the documents, never parsed as mathtext (gpubox.escape)."""
    from gpubox.escape import mathtext

    return mathtext(f"{name} ({r.name})" if len(runs) > 1 else name)


def _new(title: str, xlabel: str, ylabel: str, wide: bool = False):
    fig, ax = plt.subplots(figsize=(7.5 if wide else 6.4, 3.9), dpi=150)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _save(fig, outdir: Path, name: str, fmt: str) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    path = outdir / f"{name}.{fmt}"
    fig.tight_layout()
    # metadata pinned so the same data gives the same file (no creation date in the PDF)
    meta = {"CreationDate": None} if fmt == "pdf" else {}
    fig.savefig(path, format=fmt, metadata=meta)
    plt.close(fig)
    return path


# How far apart the series' points are drawn along x: a fraction of a category on a linear axis, a
# factor on a log axis. Two methods with the same figure at the same x would otherwise hide one
# another (one marker, one line); the tick still names the true x.
_DODGE = 0.06


def _draw(ax, lines: list[tuple], runs, pal, log_x: bool) -> int:
    """Draw each (xs, ys, run index, name, run) series, dodged sideways from the others."""
    n = len(lines)
    for k, (xs, ys, i, name, r) in enumerate(lines):
        d = _DODGE * (k - (n - 1) / 2) if n > 1 else 0.0
        xd = [x * math.exp(d / 2) for x in xs] if log_x else [x + d for x in xs]
        ax.plot(
            xd,
            ys,
            STYLES[i % 4],
            marker=pal.marker(name),
            color=pal(name),
            label=_series_name(runs, r, name),
        )
    return n


def _legend(ax, n: int) -> None:
    """Inside when few series, outside on the right when many (never over the data)."""
    if n > 4:
        ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif n:
        ax.legend(fontsize=8, frameon=False, loc="best")


def _grouped_bars(ax, bars: list[tuple], pal, fmt: str) -> None:
    """bars: (series, colour key, tp, value, run index). Each TP group holds only the series
    measured there, so a method measured at TP1 only leaves no empty slots at TP4/TP8."""
    series = list(dict.fromkeys(b[0] for b in bars))
    tps = sorted({b[2] for b in bars})
    width = 0.8 / max(sum(1 for b in bars if b[2] == tp) for tp in tps)
    drawn = set()
    for gi, tp in enumerate(tps):
        group = sorted((b for b in bars if b[2] == tp), key=lambda b: series.index(b[0]))
        x0 = gi - width * len(group) / 2
        for k, (name, colour_key, _, v, ri) in enumerate(group):
            rect = ax.bar(
                x0 + width * (k + 0.5),
                v,
                width * 0.92,
                color=pal(colour_key),
                hatch=HATCHES[ri % len(HATCHES)],
                edgecolor="white",
                label=None if name in drawn else name,
            )
            drawn.add(name)
            ax.bar_label(rect, labels=[fmt.format(v)], fontsize=7, padding=1)
    ax.set_xticks(range(len(tps)), [f"TP{t}" for t in tps])
    ax.set_ylim(0, max(b[3] for b in bars) * 1.15)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: series.index(labels[i]))
    n = len(labels)
    if n > 4:
        ax.legend(
            [handles[i] for i in order],
            [labels[i] for i in order],
            fontsize=7,
            frameon=False,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
        )
    else:
        ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=8, frameon=False)


def tok_s_by_tp(runs: list[ResultDoc], outdir: Path, fmt: str, pal: _Palette) -> Figure | None:
    fig, ax = _new("Decode tok/s by tensor-parallel size", "tensor-parallel size (GPUs)", "tok/s (batch 1)")
    all_tp = sorted({m.tp for r in runs for m in r.select("decode") if m.value is not None})
    lines: list[tuple] = []
    for i, r in enumerate(runs):
        L = ref_len(r)
        for lab, meth, bud in r.labels("decode"):
            pts = [
                (tp, m.value)
                for tp in all_tp
                for m in [r.get("decode", tp=tp, label=lab, output_len=L)]
                if m and m.value is not None
            ]
            if len(pts) < 2:
                continue
            name = method_name(meth, bud)
            lines.append(([all_tp.index(t) for t, _ in pts], [v for _, v in pts], i, name, r))
    n = _draw(ax, lines, runs, pal, log_x=False)
    if not n:
        plt.close(fig)
        return None
    ax.set_xticks(range(len(all_tp)), [f"TP{t}" for t in all_tp])
    ax.set_ylim(bottom=0)
    _legend(ax, n)
    lens = "/".join(sorted({str(ref_len(r)) for r in runs if ref_len(r)}))
    return Figure(
        "tok_s_by_tp",
        "Decode tok/s by TP",
        f"Per-request decode tok/s at {lens} output tokens for each method measured at two or more TP sizes.",
        _save(fig, outdir, "tok_s_by_tp", fmt),
    )


def speedup(runs: list[ResultDoc], outdir: Path, fmt: str, pal: _Palette) -> Figure | None:
    """Grouped bars: speculative method / auto at the same TP and output length."""
    bars: list[tuple[str, str, int, float, int]] = []  # (series, colour key, tp, x, run index)
    for ri, r in enumerate(runs):
        L = ref_len(r)
        auto = next((lab for lab, meth, _ in r.labels("decode") if str(meth).lower() == "auto"), None)
        if not auto:
            continue
        for lab, meth, bud in r.labels("decode"):
            if lab == auto:
                continue
            for tp in sorted({m.tp for m in r.select("decode")}):
                a = r.get("decode", tp=tp, label=auto, output_len=L)
                m = r.get("decode", tp=tp, label=lab, output_len=L)
                if a and m and a.value and m.value is not None:
                    name = method_name(meth, bud)
                    bars.append((_series_name(runs, r, name), name, tp, m.value / a.value, ri))
    if not bars:
        return None
    fig, ax = _new(
        "Speed-up over autoregressive decoding", "tensor-parallel size (GPUs)", "x auto (same TP)", wide=True
    )
    _grouped_bars(ax, bars, pal, fmt="{:.1f}x")
    ax.axhline(1.0, color="black", linewidth=0.8)
    return Figure(
        "speedup",
        "Speed-up over auto",
        "Each speculative method's decode tok/s divided by "
        "autoregressive (auto) decode tok/s at the same TP size and output length.",
        _save(fig, outdir, "speedup", fmt),
    )


def concurrency(runs: list[ResultDoc], outdir: Path, fmt: str, pal: _Palette) -> Figure | None:
    fig, ax = _new("Aggregate throughput vs concurrency", "concurrent requests (C)", "aggregate tok/s")
    lines: list[tuple] = []
    cs_all: set = set()
    for i, r in enumerate(runs):
        for lab, meth, bud in r.labels("concurrency"):
            for j, tp in enumerate(sorted({m.tp for m in r.select("concurrency", label=lab)})):
                pts = sorted(
                    (m.concurrency, m.value)
                    for m in r.select("concurrency", tp=tp, label=lab)
                    if m.value is not None and m.concurrency
                )
                if len(pts) < 2:
                    continue
                name = f"TP{tp} {method_name(meth, bud)}"
                cs_all |= {c for c, _ in pts}
                lines.append(([c for c, _ in pts], [v for _, v in pts], i, name, r))
    n = _draw(ax, lines, runs, pal, log_x=True)
    if not n:
        plt.close(fig)
        return None
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(cs_all), [str(c) for c in sorted(cs_all)])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    _legend(ax, n)
    return Figure(
        "concurrency",
        "Aggregate tok/s vs concurrency",
        "Sum of output tokens over wall time with C requests in flight.",
        _save(fig, outdir, "concurrency", fmt),
    )


def context(runs: list[ResultDoc], outdir: Path, fmt: str, pal: _Palette) -> Figure | None:
    fig, ax = _new("Generation speed vs context length", "prompt length (tokens)", "decode tok/s")
    lines: list[tuple] = []
    xs_all: set = set()
    for i, r in enumerate(runs):
        by: dict[tuple, list] = {}
        for w in ("long_context", "agentic"):
            for m in r.select(w):
                if m.value is not None and m.context_tokens:
                    by.setdefault((m.tp, m.label, m.method, m.budget), []).append((m.context_tokens, m.value))
        for j, ((tp, lab, meth, bud), pts) in enumerate(sorted(by.items(), key=lambda t: (t[0][0], t[0][1]))):
            pts.sort()
            name = f"TP{tp} {method_name(meth, bud)}"
            xs_all |= {c for c, _ in pts}
            lines.append(([c for c, _ in pts], [v for _, v in pts], i, name, r))
    n = _draw(ax, lines, runs, pal, log_x=True)
    if not n:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xticks(sorted(xs_all), [ctx_name(c) for c in sorted(xs_all)])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    _legend(ax, n)
    return Figure(
        "context",
        "Generation tok/s vs context",
        "Decode tok/s after prompts of each length (long-context and agentic workloads).",
        _save(fig, outdir, "context", fmt),
    )


def acceptance(runs: list[ResultDoc], outdir: Path, fmt: str, pal: _Palette) -> Figure | None:
    bars = []
    for ri, r in enumerate(runs):
        L = ref_len(r)
        for lab, meth, bud in r.labels("decode"):
            for tp in sorted({m.tp for m in r.select("decode")}):
                m = r.get("decode", tp=tp, label=lab, output_len=L)
                if m is None or m.accept_len is None:
                    m = next(
                        (x for x in r.select("decode", tp=tp, label=lab) if x.accept_len is not None), None
                    )
                if m is not None:
                    name = method_name(meth, bud)
                    bars.append((_series_name(runs, r, name), name, tp, m.accept_len, ri))
    if not bars:
        return None
    fig, ax = _new(
        "Acceptance length by TP", "tensor-parallel size (GPUs)", "mean accepted tokens / step", wide=True
    )
    _grouped_bars(ax, bars, pal, fmt="{:.1f}")
    return Figure(
        "acceptance",
        "Acceptance length by TP",
        "Mean acceptance length (1 + accepted/drafts); bars of one method should be level across TP.",
        _save(fig, outdir, "acceptance", fmt),
    )


def comparison(base: ResultDoc, new: ResultDoc, outdir: Path, fmt: str, top: int = 16) -> Figure | None:
    from gpubox.escape import mathtext

    ds = deltas(base, new)
    if not ds:
        return None
    ds = sorted(ds, key=lambda t: -abs(t[2]))[:top]
    ds.sort(key=lambda t: t[2])
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(ds) + 1.3), dpi=150)
    labels = [mathtext(describe(m)) for _, m, _ in ds]
    vals = [d for _, _, d in ds]
    rects = ax.barh(range(len(ds)), vals, color=["#2ca02c" if v >= 0 else "#d62728" for v in vals])
    ax.bar_label(rects, labels=[f"{v:+.1f}%" for v in vals], fontsize=7, padding=2)
    ax.set_yticks(range(len(ds)), labels, fontsize=7)
    ax.axvline(0, color="black", linewidth=0.8)
    lo, hi = min(0, min(vals)), max(0, max(vals))
    pad = (hi - lo) * 0.18 or 1
    ax.set_xlim(lo - (pad if lo < 0 else 0), hi + pad)
    ax.set_xlabel(mathtext(f"change, {new.name} vs {base.name} (%)"))
    ax.set_title(mathtext(f"{new.name} vs {base.name}"), fontsize=11)
    ax.spines[["top", "right"]].set_visible(False)
    return Figure(
        f"compare-{_safe(base.name)}-{_safe(new.name)}",
        f"{new.name} vs {base.name}",
        f"Change in tok/s for the {len(ds)} largest differences among measurements both runs made.",
        _save(fig, outdir, f"compare-{_safe(base.name)}-{_safe(new.name)}", fmt),
    )


def _safe(name: str) -> str:
    """A file-name-safe form of a run name (run names come from file stems or --name)."""
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)[:60] or "run"


PLOTS = (tok_s_by_tp, speedup, concurrency, context, acceptance)


def make_all(runs: list[ResultDoc], outdir: Path, fmt: str, compare: bool = False) -> list[Figure]:
    """Draw every figure the data supports into outdir as fmt ('pdf' or 'png')."""
    pal = _Palette()
    figs = [f for f in (p(runs, outdir, fmt, pal) for p in PLOTS) if f is not None]
    if compare:
        figs += [f for f in (comparison(runs[0], r, outdir, fmt) for r in runs[1:]) if f is not None]
    return figs
