"""The benchmark result document (`gpubox.bench/1`) and the history line that carries it
(`gpubox.history/1`) as typed models (gpubox.docmodel): one declaration that reading checks,
writing emits and docs/result-schema.md is generated from (`python -m gpubox.bench.schema_doc`).

Every reader loads through `BenchResult` (bench.schema.load / check / history_line are its
entry points), so a document that breaks the schema is one ResultError naming the file (or store
line) and the field, exit 2. Fields whose check is looser than their documented shape (free-form
facts, server notes, repairs) are typed `any` in the check so that what loads today still loads;
their shape is documented and read through the typed views (`Facts.gpu_list`, `repair_list`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from gpubox.docmodel import Model, Problem, bounded, short, spec

from .result_read import (
    HISTORY_SCHEMA,
    MAX_DEPTH,
    MAX_INT,
    MAX_STR,
    SCHEMA,
    SCHEMA_RE,
    STATUSES,
    VERDICTS,
    WORKLOADS,
    ResultError,
    parse,
    read_text,
)

NUM = "number?"
POS = "pos?"  # a rate or length that is divided by: > 0, bounded so arithmetic stays finite
NONNEG = "nonneg?"  # a duration or a fraction: >= 0, bounded the same way

# method -> how people name it (the seed report's words). Unknown methods print as given.
METHOD_NAMES = {
    "auto": "auto",
    "ar": "auto",
    "autoregressive": "auto",
    "dflash": "DFlash",
    "linear": "DFlash",
    "ddtree": "DDTree",
}


def method_name(method: str | None, budget: int | None) -> str:
    """'ddtree', 15 -> 'DDTree b15'; 'auto' -> 'auto'."""
    name = METHOD_NAMES.get(str(method).lower(), str(method))
    return name if budget is None else f"{name} b{budget}"


def method_order(label: str, method: str | None, budget: int | None) -> tuple:
    """Sort auto first, then DFlash, then DDTree, each by budget."""
    rank = {"auto": 0, "DFlash": 1, "DDTree": 2}.get(METHOD_NAMES.get(str(method).lower(), ""), 3)
    return (rank, budget if budget is not None else -1, label)


FIX = "give a result written by `gpubox bench` (docs/result-schema.md)"


class _Part(Model):
    ERROR = ResultError
    FIX = FIX


@dataclass
class Percentiles(_Part):
    TITLE: ClassVar[str] = "percentiles: `ttft_s`, `tpot_ms`, `e2e_s`"
    p50: float | None = spec(NONNEG, "median")
    p90: float | None = spec(NONNEG, "90th percentile")
    p99: float | None = spec(NONNEG, "99th percentile")
    mean: float | None = spec(NONNEG, "mean")


@dataclass
class Acceptance(_Part):
    TITLE: ClassVar[str] = "measurements[].acceptance"
    mean_length: float | None = spec(POS, "mean accepted length per draft step (tokens)")
    rate: float | None = spec(NONNEG, "accepted / drafted tokens")
    per_position: list[float | None] | None = spec(
        ("list?", NONNEG), "acceptance rate at each draft position"
    )
    drafts: int | None = spec("int?", "draft steps counted")
    draft_tokens: int | None = spec("int?", "tokens drafted")
    accepted: int | None = spec("int?", "drafted tokens accepted")


@dataclass
class Sample(_Part):
    TITLE: ClassVar[str] = "measurements[].samples[]"
    rep: int | None = spec("int?", "repetition the request belongs to (0-based)")
    ttft_s: float | None = spec(
        NONNEG, "time to first token, from the socket write (s); null when the request failed"
    )
    e2e_s: float | None = spec(NONNEG, "time to the last token, from the socket write (s)")
    output_tokens: int | None = spec("any", "tokens generated (`usage.completion_tokens`)", shape="int?")
    prompt_tokens: int | None = spec(
        "any", "prompt tokens as the server counted them (`usage.prompt_tokens`)", shape="int?"
    )
    chunks: int | None = spec("any", "stream chunks received", shape="int")
    error: str | None = spec("str?", "why the request failed, one line; null when it succeeded")
    send_wait_s: float | None = spec(
        "any",
        "client-side wait before the request reached the socket (TTFT and E2E start at the write)",
        shape="number?",
    )
    tokens_source: str | None = spec(
        "any",
        "where `output_tokens` came from: `usage` | `tokenizer` | `chunks` (chunks: less exact)",
        shape="str?",
    )
    clock: str | None = spec(
        "any",
        "which stamps timed the request, `<send>/<first token>`: send `kernel` | `syscall` (send() returned); "
        "first token `kernel` (receive stamp) | `kernel-late` (read with later tokens) | `loop` (read callback); "
        "`read/read` over https (the client's own clock)",
        shape="str?",
    )


@dataclass
class Measurement(_Part):
    TITLE: ClassVar[str] = "measurements[]: one per (server, workload point)"
    key: str = spec(
        "str", "stable id used by history and verdicts, e.g. `tp4/ddtree:15/decode/out1024`", default=""
    )
    tp: int = spec("posint", "tensor-parallel size", default=1)
    method: str | None = spec("str?", "`auto` | `linear` | `ddtree` (or `custom` for `--url`)")
    budget: int | None = spec("int?", "speculative budget; null for auto")
    label: str = spec("str", "`auto`, `linear:<B>`, `ddtree:<B>`", default="")
    workload: str = spec(("enum", WORKLOADS), "what was measured (keys below)", default="decode")
    output_len: int | None = spec("int?", "tokens generated per request")
    concurrency: int | None = spec("int?", "requests in flight")
    context_tokens: int | None = spec("int?", "prompt tokens for long_context / agentic")
    status: str = spec(("enum", STATUSES), "whether it ran; failed/skipped say why", default="ok")
    reason: str | None = spec("str?", "why failed/skipped, one line")
    repetitions: int | None = spec("int?", "repetitions measured")
    tok_s: float | None = spec(POS, "median over reps of per-request decode tok/s (null unless ok)")
    tok_s_spread: list[float | None] | None = spec(("list?", NONNEG), "min, max over repetitions")
    aggregate_tok_s: float | None = spec(POS, "sum of output tokens / wall time (concurrency's headline)")
    ttft_s: Percentiles | None = spec(("model?", Percentiles), "time to first token (s)")
    tpot_ms: Percentiles | None = spec(
        ("model?", Percentiles), "time per output token (ms): (E2E - TTFT) / (n - 1)"
    )
    e2e_s: Percentiles | None = spec(("model?", Percentiles), "request latency (s)")
    tokens_per_chunk: float | None = spec(POS, "output tokens per stream chunk")
    errors: int | None = spec("int?", "failed requests in this measurement")
    acceptance: Acceptance | None = spec(
        ("model?", Acceptance), "speculative-decoding counters; null when the server exposes none"
    )
    samples: list[Sample] | None = spec(
        ("list?", ("model", Sample)), "raw per-request samples of every repetition (not kept in history)"
    )

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def headline_field(self) -> str:
        """The figure a measurement is judged by: aggregate tok/s under concurrency, else tok/s."""
        return "aggregate_tok_s" if self.workload == "concurrency" else "tok_s"

    @property
    def value(self) -> float | None:
        """The headline figure when the measurement ran: aggregate tok/s for concurrency, decode
        tok/s otherwise."""
        if not self.ok:
            return None
        v = getattr(self, self.headline_field)
        return float(v) if isinstance(v, (int, float)) else None

    @property
    def accept_len(self) -> float | None:
        """Mean acceptance length when the measurement ran and the server counted drafts."""
        acc = self.acceptance
        if self.ok and acc is not None and isinstance(acc.mean_length, (int, float)):
            return float(acc.mean_length)
        return None

    @property
    def method_name(self) -> str:
        return method_name(self.method, self.budget)


@dataclass
class Server(_Part):
    TITLE: ClassVar[str] = "servers[]: one per (tp, method) server launch"
    tp: int = spec("posint", "tensor-parallel size", default=1)
    method: str | None = spec("str?", "`auto` | `linear` | `ddtree` (or the method named for `--url`)")
    budget: int | None = spec("int?", "speculative budget")
    label: str = spec("str", "`auto`, `linear:<B>`, `ddtree:<B>`", default="")
    gpus: list[int] | None = spec(("list?", "int"), "GPU indices the server ran on")
    command: list[str] | None = spec(("list?", "str"), "the server's argv")
    env: dict[str, str] | None = spec(
        ("map?", None), "environment set for the server", shape="object (string -> string), or null"
    )
    status: str = spec(("enum", STATUSES), "whether it ran; failed/skipped say why", default="ok")
    error: str | None = spec("str?", "why the server failed, one line")
    log_tail: str | list[str] | None = spec(
        "any", "the log's last lines", shape="string, list of string, or null"
    )
    startup_s: float | None = spec(NONNEG, "seconds until the server answered")
    max_model_len: int | None = spec("int?", "context length the server reports")
    log: str | None = spec("any", "the server's log file", shape="str?")
    url: str | None = spec("any", "the server measured (`bench run --url`)", shape="str?")
    model: str | None = spec("any", "the model the server serves (`bench run --url`)", shape="str?")
    client: dict[str, Any] | None = spec(
        "any",
        "what the client learned about this server: `prompt_sizing` (server /tokenize, local tokenizer or "
        "calibration), `prompt_sizing_tried`, `sampling_extras_accepted` (ignore_eos/min_tokens), `notes`",
        shape=("map?", None),
    )


@dataclass
class Reason(_Part):
    TITLE: ClassVar[str] = "verdict.reasons[]"
    level: str | None = spec("str?", "`healthy` | `degraded` | `failed`")
    key: str | None = spec("str?", "the measurement key (or `tp<N>/<label>` for a server)")
    kind: str | None = spec("str?", "`measurement` | `history` | `expectation` (history verdicts)")
    message: str = spec("str", "one line for people", default="")
    observed: float | None = spec("any", "the figure seen", shape="number?")
    expected: float | None = spec("any", "the figure expected", shape="number?")
    field: str | None = spec("any", "the figure compared: `tok_s` | `aggregate_tok_s`", shape="str?")
    baseline: float | None = spec("any", "history: median of the last healthy runs", shape="number?")
    baseline_runs: list[str] | None = spec(
        "any", "history: the run_ids of that median", shape=("list?", "str")
    )
    drop: float | None = spec("any", "fraction below the baseline or expectation", shape="number?")
    pattern: str | None = spec("any", "history: `sustained` | `one-off`", shape="str?")
    runs_below: int | None = spec("any", "history: runs in a row below the threshold", shape="int?")


@dataclass
class Verdict(_Part):
    """The health verdict (bench.verdict.decide, bench.regress): worst level wins."""

    TITLE: ClassVar[str] = "verdict"
    status: str = spec(("enum", VERDICTS), "the worst level among the reasons", default="failed")
    reasons: list[Reason] | None = spec(("list?", ("model", Reason)), "one per finding, in order")


@dataclass
class Tool(_Part):
    TITLE: ClassVar[str] = "tool"
    version: str | None = spec("str?", "gpubox version")
    git: str | None = spec("str?", "git commit of the checkout it ran from")


@dataclass
class Gpu(_Part):
    TITLE: ClassVar[str] = "facts.gpus[]"
    index: int | None = spec("any", "GPU index", shape="int")
    name: str | None = spec("any", "product name", shape="str?")
    bus_id: str | None = spec("any", "PCI address", shape="str?")
    numa_node: int | None = spec("any", "NUMA node (-1 or null: unknown)", shape="int?")
    link: str | None = spec("any", "PCIe link, e.g. `Gen5 x16`", shape="str?")
    memory_mib: int | None = spec("any", "memory (MiB)", shape="int?")


@dataclass
class Facts(_Part):
    """What the report appendix needs about the box as measured (bench.measure.box_facts)."""

    TITLE: ClassVar[str] = "facts: the box as it was measured"
    gpus: list[dict[str, Any]] | None = spec(
        "any", "the GPUs (facts.gpus[] below)", shape=("list", ("model", Gpu))
    )
    driver: str | None = spec("any", "NVIDIA driver version", shape="str?")
    nccl_env: dict[str, str] | None = spec(
        "any", "NCCL_* variables the box sets", shape="object (string -> string)"
    )
    nccl_profile: str | None = spec("any", "the inventory's NCCL profile", shape="str?")
    pcie_mrrs: dict[str, int] | None = spec(
        "any", "bus id -> PCIe MaxReadReq bytes", shape="object (string -> integer)"
    )
    numa_balancing: int | None = spec("any", "/proc/sys/kernel/numa_balancing", shape="int?")
    engine: str | None = spec("any", "`vllm` | `sglang` | `custom`", shape="str?")
    model: str | None = spec("any", "model directory", shape="str?")
    drafter: str | None = spec("any", "drafter directory", shape="str?")
    topology_source: str | None = spec(
        "any",
        "where the GPU facts came from: NVML in the container, the host's sysfs, or the inventory",
        shape="str?",
    )

    def gpu_list(self) -> list[Gpu]:
        """The GPU objects as typed views (entries that are not objects are left out)."""
        return [Gpu.from_dict(g) for g in self.gpus or [] if isinstance(g, dict)]


@dataclass
class Repair(_Part):
    TITLE: ClassVar[str] = "repairs[]: what `gpubox recover` changed before this measurement"
    step: str | None = spec("any", "the step that ended fixed", shape="str")
    host: str | None = spec("any", "where it changed", shape="str")
    detail: str | None = spec("any", "what it saw and set (before -> after)", shape="str")
    commands: list[list[str]] | None = spec(
        "any", "the commands it ran (argv lists)", shape=("list", ("list", "str"))
    )


REQUIRED = ("schema", "box", "run_id", "started_at")


@dataclass
class BenchResult(_Part):
    """One benchmark run (`gpubox.bench/1`)."""

    TITLE: ClassVar[str] = "the document"
    schema: str = spec("str", f"`{SCHEMA}`", default=SCHEMA)
    box: str = spec("str", "the box's name", default="")
    box_id: str | None = spec(
        "str?", "the inventory box's identity (below); absent for a server measured by URL"
    )
    run_id: str = spec("str", "`<box>-<UTC stamp>`", default="")
    started_at: str = spec("str", "UTC, ISO 8601", default="")
    finished_at: str | None = spec("str?", "UTC, ISO 8601")
    profile: str | None = spec("str?", "`health` | `full` | `custom`")
    tool: Tool | None = spec(("model?", Tool), "the gpubox that measured")
    simulated: bool | None = spec("bool?", "true when the server is gpubox's simulator")
    sim_speed: float | None = spec(POS, "simulator speed factor k: figures are k x the modelled box")
    url: str | None = spec("str?", "set by `gpubox bench run --url` (no launch)")
    facts: Facts | None = spec(("model?", Facts), "the box as it was measured (report appendix)")
    servers: list[Server] = spec(
        ("list", ("model", Server)), "one per (tp, method) server launch", default=[]
    )
    measurements: list[Measurement] = spec(
        ("list", ("model", Measurement)), "flat list; one per (server, workload point)", default=[]
    )
    verdict: Verdict | None = spec(("model", Verdict), "the health verdict")
    repairs: list[dict[str, Any]] | None = spec(
        "any",
        "what `gpubox recover` changed before this run (written by recover)",
        shape=("list?", ("model", Repair)),
    )

    @classmethod
    def problem(cls, doc: Any) -> str | None:
        """The first way DOC breaks the schema (field path and what is wrong), or None."""
        try:
            cls.from_dict(doc)
        except Problem as exc:
            return str(exc)
        return None

    @classmethod
    def from_dict(cls, v: Any, path: str = "") -> BenchResult:
        if not isinstance(v, dict):
            raise Problem(f"top level is {_kind(v)}, not a result object")
        schema = v.get("schema")
        if schema != SCHEMA:
            m = SCHEMA_RE.match(schema) if isinstance(schema, str) else None
            if m and int(m.group(1)) > 1:
                raise Problem(f"schema: {schema} is newer than this gpubox reads ({SCHEMA}); upgrade gpubox")
            raise Problem(f"schema: {short(schema)}, expected {SCHEMA!r}")
        for k in REQUIRED:
            if k not in v:
                raise Problem(f"{k}: missing")
        p = bounded(v, "", MAX_DEPTH, MAX_INT, MAX_STR)
        if p:
            raise Problem(p)
        doc = super().from_dict(v, path)
        keys = set()
        for i, m in enumerate(doc.measurements):
            if m.key in keys:
                raise Problem(f"measurements[{i}].key: {short(m.key)} appears twice")
            keys.add(m.key)
            if m.status in ("failed", "skipped"):
                for k in ("tok_s", "aggregate_tok_s", "ttft_s", "tpot_ms"):
                    if getattr(m, k) is not None:
                        raise Problem(
                            f"measurements[{i}].{k}: set on a {m.status} measurement (must be null)"
                        )
        return doc

    @classmethod
    def view(cls, v: Any) -> BenchResult:
        """The typed fields of V without the document-level rules (schema string, required keys,
        bounds, unique keys): for a document already checked, or a partial one a test builds."""
        return Model.from_dict.__func__(cls, v)  # type: ignore[attr-defined]

    @classmethod
    def from_json(cls, text: str | bytes, where_: str = "result") -> BenchResult:
        return cls.check(parse(text, where_), where_)

    @classmethod
    def load(cls, path: Any) -> BenchResult:
        """One result file, parsed strictly and checked (ResultError naming the file and field)."""
        return cls.from_json(read_text(path), str(path))

    def repair_list(self) -> list[Repair]:
        """`repairs` as typed views (entries that are not objects are left out)."""
        return [Repair.from_dict(r) for r in self.repairs or [] if isinstance(r, dict)]


BOX_ID_RE = re.compile(r"^[A-Za-z0-9_-]+-ct[0-9]+$")  # gpubox.identity.box_id's shape


def _kind(v: Any) -> str:
    from gpubox.docmodel import kind_of

    return kind_of(v)


@dataclass
class HistoryRecord(_Part):
    """One line of a box's history store (bench.history): the run without its raw samples."""

    TITLE: ClassVar[str] = "history store line (`gpubox.history/1`)"
    INDENT: ClassVar[int | None] = None
    SEPARATORS: ClassVar[tuple[str, str] | None] = (",", ":")
    NEWLINE: ClassVar[str] = ""
    history: str | None = spec("any", f"`{HISTORY_SCHEMA}`", shape="str", checked=True)
    recorded_at: str | None = spec("any", "when it was recorded (UTC, ISO 8601)", shape="str")
    doc: BenchResult | None = spec(
        "any",
        "the result document, without `measurements[].samples`",
        shape=("model", BenchResult),
        checked=True,
    )

    @classmethod
    def from_dict(cls, v: Any, path: str = "") -> HistoryRecord:
        if not isinstance(v, dict) or not isinstance(v.get("doc"), dict):
            raise Problem("not a history record")
        h = v.get("history")
        if h is not None and h != HISTORY_SCHEMA:
            raise Problem(f"history: {short(h)}, expected {HISTORY_SCHEMA!r}")
        rec = super().from_dict(v, path)
        rec.doc = BenchResult.from_dict(v["doc"])
        return rec

    @classmethod
    def from_line(cls, line: str, where_: str) -> HistoryRecord:
        """One store line, checked; ResultError naming WHERE_ (file:line)."""
        v = parse(line, where_)
        try:
            return cls.from_dict(v)
        except Problem as exc:
            msg = str(exc)
            if msg == "not a history record":
                raise ResultError(f"{where_}: {msg}", "a line is {history, recorded_at, doc}") from None
            if msg.startswith("history: "):
                raise ResultError(f"{where_}: {msg}", "upgrade gpubox") from None
            raise ResultError(f"{where_}: {msg}", FIX) from None

    @classmethod
    def new(cls, doc: BenchResult, recorded_at: str) -> HistoryRecord:
        return cls(history=HISTORY_SCHEMA, recorded_at=recorded_at, doc=doc)
