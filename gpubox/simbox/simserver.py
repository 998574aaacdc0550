"""SIMULATOR of a vLLM-style OpenAI-compatible inference server (no GPU, no model).

This is NOT a real inference server. It exists so that tests and the demo can drive the real
launcher, client, metrics scraper and verdict against a real HTTP server process that behaves like
vLLM serving Qwen3.6-27B with DFlash/DDTree speculative decoding on the seed box:

- endpoints: /health, /v1/models, /tokenize, /metrics, /v1/completions, /v1/chat/completions
  (SSE streaming, `stream_options.include_usage` final usage chunk, `data: [DONE]`);
- HTTP 400 in vLLM's error JSON shape when prompt + max_tokens exceeds max_model_len
  (docs/facts.md "Serving benchmarks": the seed's 25k-context failure);
- decode rates from the seed's reference figures (docs/facts.md "Reference figures"), with TP, output-length,
  concurrency and long-context effects; speculative methods emit several tokens per SSE chunk and
  count vllm:spec_decode_* on /metrics like vLLM does;
- `--speed K` multiplies every simulated rate (and divides every delay) so tests finish quickly.
  Tokens really are paced in time: a client measures K x the seed's tok/s, and results record
  "simulated": true and "sim_speed": K so reports can divide it back out;
- the box's tuning state (`--host-root`/`--root`): at start it reads the same files gpubox tunes
  (the GPUs' PCIe MaxReadReq in sysfs config space, kernel.numa_balancing, the NCCL variables its
  own environment and NCCL's config files give it) and slows decoding the way the untuned seed box
  was slower (see "tuning state" below); `/sim/state` and the log say what it saw;
- failure switches for tests: --fail-start, --die-after N, --hang-after N, --error-status CODE,
  --close-after N.

Tokenizer: one whitespace-separated word is one token (exact and cheap, so /tokenize-sized prompts
are exact). Stdlib asyncio only: no web framework dependency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# -- the performance model (docs/facts.md "Reference figures", Qwen3.6-27B, 8x RTX PRO 6000, PCIe) ------------
# single-stream decode tok/s at 1024 output tokens, per TP size
BASE_1024 = {
    "auto": {1: 26.6, 4: 37.8, 8: 37.6},
    "ddtree": {1: 173.4, 4: 281.1, 8: 263.9},
    "linear": {1: 106.0, 4: 106.0 * 281.1 / 173.4, 8: 106.0 * 263.9 / 173.4},
}
# TP1 figures at 256/1024/2048 output tokens: the shape of the output-length curve
OUT_CURVE = {
    "auto": {256: 26.4 / 26.6, 1024: 1.0, 2048: 26.4 / 26.6},
    "ddtree": {256: 123.9 / 173.4, 1024: 1.0, 2048: 168.8 / 173.4},
    "linear": {256: 99.7 / 106.0, 1024: 1.0, 2048: 121.0 / 106.0},
}
# per-request slowdown with C concurrent streams: rate / (1 + a * (C - 1)); from the seed's C=8
# aggregates (TP4 1270.8, TP8 727.0 tok/s for DDTree b15); auto batches almost for free.
CONTENTION = {
    "auto": {1: 0.02, 4: 0.02, 8: 0.02},
    "ddtree": {1: 0.15, 4: 0.110, 8: 0.272},
    "linear": {1: 0.12, 4: 0.09, 8: 0.2},
}
# long context: rate / (1 + max(0, ctx - 16k) / K); K from DDTree b15 at 100k: TP4 5.7, TP8 35.2 tok/s
LONG_K = {1: 4000.0, 4: 1737.0, 8: 12900.0}
# mean acceptance length (1 + accepted/drafts) per budget; independent of TP on a healthy box
ACCEPT_LEN = {"linear": 4.0, "ddtree": {15: 6.5, 16: 6.6, 32: 7.2, 64: 7.6}}
BUDGET_COST = {15: 1.0, 16: 1.0, 32: 0.95, 64: 0.85}
PREFILL_TOK_S = {1: 6000.0, 4: 16000.0, 8: 20000.0}
TTFT_BASE_S = 0.030


def _tp_key(tp: int) -> int:
    return min((1, 4, 8), key=lambda k: abs(k - tp))


def _curve(method: str, out_len: int) -> float:
    pts = sorted(OUT_CURVE[method].items())
    x = math.log2(max(out_len, 1))
    for (a, fa), (b, fb) in zip(pts, pts[1:]):
        la, lb = math.log2(a), math.log2(b)
        if x <= lb:
            t = min(max((x - la) / (lb - la), 0.0), 1.0)
            return fa + t * (fb - fa)
    return pts[-1][1]


def decode_rate(method: str, budget: int, tp: int, out_len: int, active: int, ctx_tokens: int) -> float:
    """Simulated per-request decode tok/s (before the speed factor)."""
    k = _tp_key(tp)
    r = BASE_1024[method][k] * _curve(method, out_len)
    if method == "ddtree":
        r *= BUDGET_COST.get(budget, 0.85)
    r /= 1.0 + CONTENTION[method][k] * max(active - 1, 0)
    r /= 1.0 + max(0, ctx_tokens - 16384) / LONG_K[k]
    return r


# -- the tuning state and its effect (docs/facts.md "Reference figures") ---------------------------------------
# On the seed box, tuning (NCCL variables + MaxReadReq 4096 + NUMA balancing off) gave +7.5% single
# stream (DDTree b15, 256 tok) and +18.5% under concurrency. The seed measured the three together,
# so there is no figure per knob: each gets an equal third of the log-gain (an assumption, stated in
# docs/bench.md). NCCL and MRRS act only at TP>1 (TP1 has no collective traffic; at batch 1 MRRS
# hardly touches host-device copies); NUMA balancing (page-migration faults on the threads that
# drive the GPUs) acts at every TP, as stalls.
TUNING_GAIN_SINGLE = 1.075
TUNING_GAIN_C8 = 1.185
TUNING_WEIGHT = {"nccl": 1 / 3, "mrrs": 1 / 3, "numa": 1 / 3}
NUMA_STALL_P = 0.25  # share of decode steps that hit a NUMA-balancing stall
MRRS_TUNED = 4096
# What pays on the seed's PCIe 2-NUMA hardware (hwtune/profiles/pcie-2numa.yaml): the hardware's
# truth, so the simulator does not read the profile it is judging.
NCCL_TUNED = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MIN_CTAS": "8"}
NCCL_ALIASES = {
    "NCCL_MIN_CTAS": ("NCCL_MIN_NCHANNELS",)
}  # deprecated since 2.17 (docs/facts.md "NCCL environment")
NCCL_TOKENS = {
    "NCCL_ALGO": {"ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"},
    "NCCL_PROTO": {"ll", "ll128", "simple"},
}
PCI_DEVICES = "sys/bus/pci/devices"
NUMA_SYSCTL = "proc/sys/kernel/numa_balancing"


def read_devctl(config: bytes) -> int | None:
    """DevCtl (CAP_EXP+8) from raw config space: walk the capability list from 0x34 to the PCI
    Express capability (id 0x10). Parsed here rather than with hwtune.pcie so the simulator stays
    a stdlib-only process that reads exactly the bytes the kernel would hand out."""
    if len(config) < 0x40:
        return None
    ptr, seen = config[0x34] & 0xFC, set()
    while ptr and ptr not in seen and ptr + 10 <= len(config):
        seen.add(ptr)
        if config[ptr] == 0x10:
            return struct.unpack_from("<H", config, ptr + 8)[0]
        ptr = config[ptr + 1] & 0xFC
    return None


def gpu_functions(host_root: Path) -> list[tuple[str, int | None]]:
    """(BDF, MaxReadReq bytes or None) of the NVIDIA GPU functions (class 0300/0302, never the
    audio function; docs/facts.md "PCIe Device Control"), in nvidia-smi order (PCI bus id)."""
    out = []
    base = host_root / PCI_DEVICES
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        try:
            vendor = (d / "vendor").read_text().strip().lower()
            klass = (d / "class").read_text().strip().lower().removeprefix("0x").rjust(6, "0")
        except OSError:
            continue
        if vendor != "0x10de" or klass[:4] not in ("0300", "0302"):
            continue
        try:
            word = read_devctl((d / "config").read_bytes())
        except OSError:
            word = None
        code = None if word is None else (word & 0x7000) >> 12  # bits 14:12, 128 << n; 6, 7 reserved
        out.append((d.name, 128 << code if code is not None and code <= 5 else None))
    return out


def _conf_file(path: Path) -> dict[str, str]:
    """NCCL's KEY=VALUE config file (src/misc/param.cc): '#' comments, blank lines skipped."""
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return out
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out.setdefault(k.strip(), v.strip())
    return out


def nccl_settings(env: dict[str, str], root: Path | None) -> dict[str, tuple[str, str]]:
    """name -> (value, source) as NCCL itself sees them: the process environment wins, then
    $NCCL_CONF_FILE or ~/.nccl.conf, then /etc/nccl.conf (docs/facts.md "NCCL environment"); files are
    read inside the server's root."""
    out = {k: (v, "environment") for k, v in env.items() if k.startswith("NCCL_")}
    if root is None:
        return out
    user = env.get("NCCL_CONF_FILE") or "/root/.nccl.conf"  # the server runs as root in the CT
    for logical in (user, "/etc/nccl.conf"):
        for k, v in _conf_file(root / logical.lstrip("/")).items():
            if k.startswith("NCCL_") and k not in out:
                out[k] = (v, logical)
    return out


def nccl_fatal(settings: dict[str, tuple[str, str]]) -> str | None:
    """NCCL rejects bad NCCL_ALGO/NCCL_PROTO tokens at init (docs/facts.md "NCCL environment"); a misspelled name is ignored."""
    for name, allowed in NCCL_TOKENS.items():
        if name not in settings:
            continue
        value, source = settings[name]
        if ";" in value or ":" in value:  # per-collective syntax: not modelled, accepted
            continue
        for tok in value.split(","):
            t = tok.strip().lstrip("^").lower()
            if t and t not in allowed:
                return f"{name}={value} (from {source}): unknown token {tok.strip()!r}"
    return None


def _nccl_tuned(name: str, settings: dict[str, tuple[str, str]]) -> bool:
    want = NCCL_TUNED[name]
    for n in (name, *NCCL_ALIASES.get(name, ())):
        if n in settings:
            value = settings[n][0].strip()
            if name == "NCCL_MIN_CTAS":
                try:
                    return int(value, 0) >= int(want)
                except ValueError:
                    return False
            return value.lower() == want.lower()
    return False


@dataclass
class Tuning:
    """What the simulator saw at start, and how untuned each knob is (0 = tuned, 1 = the seed's
    untuned state; MRRS scales with log2(4096/MRRS) / 3, so 512 bytes = 1)."""

    modelled: bool = False
    tp: int = 1
    gpus: list[dict] = field(default_factory=list)
    numa_balancing: str | None = None
    nccl: dict[str, dict] = field(default_factory=dict)
    nccl_fatal: str | None = None
    severity: dict[str, float] = field(default_factory=lambda: {"nccl": 0.0, "mrrs": 0.0, "numa": 0.0})
    notes: list[str] = field(default_factory=list)

    def weight(self, parts=("nccl", "mrrs", "numa")) -> float:
        """Sum of the untuned knobs' shares; NCCL and MRRS count only at TP>1."""
        w = 0.0
        for k in parts:
            if k in ("nccl", "mrrs") and self.tp <= 1:
                continue
            w += TUNING_WEIGHT[k] * self.severity[k]
        return w

    def factor(self, active: int, parts=("nccl", "mrrs", "numa")) -> float:
        """Decode-rate multiplier with `active` concurrent streams: the seed's gain, log-interpolated
        from single stream (1.075) to C=8 (1.185), raised to the untuned share."""
        x = min(max(active - 1, 0), 7) / 7
        ln_gain = math.log(TUNING_GAIN_SINGLE) + (math.log(TUNING_GAIN_C8) - math.log(TUNING_GAIN_SINGLE)) * x
        return math.exp(-ln_gain * self.weight(parts))

    def to_dict(self) -> dict:
        return {
            "simulated": True,
            "modelled": self.modelled,
            "tp": self.tp,
            "gpus": self.gpus,
            "numa_balancing": self.numa_balancing,
            "nccl": self.nccl,
            "nccl_fatal": self.nccl_fatal,
            "severity": self.severity,
            "notes": self.notes,
            "factor_single_stream": round(self.factor(1), 4),
            "factor_c8": round(self.factor(8), 4),
        }

    def summary(self) -> str:
        if not self.modelled:
            return "not modelled (no --host-root): decode rates are the tuned seed's"
        mrrs = ",".join(f"{g['index']}:{g['mrrs'] or '?'}" for g in self.gpus) or "no GPU functions"
        nccl = " ".join(f"{k}={'ok' if v['tuned'] else 'untuned'}" for k, v in self.nccl.items())
        return (
            f"tp={self.tp} MaxReadReq[{mrrs}] numa_balancing={self.numa_balancing} {nccl} -> decode "
            f"x{self.factor(1):.3f} single stream, x{self.factor(8):.3f} at C=8"
        )


def read_tuning(tp: int, env: dict[str, str], host_root: str | None, root: str | None) -> Tuning:
    """The tuning state from the files gpubox tunes: <host_root>/sys/bus/pci/devices/*/config
    (MRRS of the GPUs in CUDA_VISIBLE_DEVICES), <host_root>/proc/sys/kernel/numa_balancing, and the
    NCCL settings of this process (environment over <root>'s NCCL config files)."""
    t = Tuning(tp=tp)
    if not host_root:
        return t
    t.modelled = True
    hroot = Path(host_root)
    funcs = gpu_functions(hroot)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    try:
        idx = [int(x) for x in visible.split(",") if x.strip()] if visible else list(range(tp))
    except ValueError:
        t.notes.append(f"CUDA_VISIBLE_DEVICES={visible!r} is not a list of indices; using 0..{tp - 1}")
        idx = list(range(tp))
    for i in idx[: max(tp, 1)]:
        if i < len(funcs):
            t.gpus.append({"index": i, "bdf": funcs[i][0], "mrrs": funcs[i][1]})
        else:
            t.notes.append(f"GPU {i} has no PCI function under {hroot / PCI_DEVICES}")
    known = [g["mrrs"] for g in t.gpus if g["mrrs"]]
    if known:  # a collective waits for the slowest member: the worst GPU of the group counts
        t.severity["mrrs"] = max(0.0, math.log2(MRRS_TUNED / min(known)) / 3)
    try:
        t.numa_balancing = (hroot / NUMA_SYSCTL).read_text().strip()
    except OSError:
        t.numa_balancing = None  # kernel without CONFIG_NUMA_BALANCING: nothing scans
    try:  # bit 0 = NUMA_BALANCING_NORMAL; 2 (memory tiering) only promotes from slow tiers
        t.severity["numa"] = 1.0 if t.numa_balancing and int(t.numa_balancing) & 1 else 0.0
    except ValueError:
        t.notes.append(f"numa_balancing={t.numa_balancing!r} is not a number")
    settings = nccl_settings(env, Path(root) if root else None)
    t.nccl = {
        k: {
            "value": settings.get(k, (None, None))[0],
            "source": settings.get(k, (None, None))[1],
            "tuned": _nccl_tuned(k, settings),
        }
        for k in NCCL_TUNED
    }
    for k in NCCL_TUNED:
        for alias in NCCL_ALIASES.get(k, ()):
            if k not in settings and alias in settings:
                t.nccl[k].update(value=settings[alias][0], source=f"{settings[alias][1]} ({alias})")
    t.severity["nccl"] = sum(not v["tuned"] for v in t.nccl.values()) / len(NCCL_TUNED)
    t.nccl_fatal = nccl_fatal(settings)
    return t


def accept_prob(mean_len: float, budget: int) -> float:
    """p with sum_{i=1..B} p^i = mean_len - 1: each draft position accepted given the previous one."""
    target = mean_len - 1.0
    lo, hi = 0.0, 0.9999
    for _ in range(60):
        mid = (lo + hi) / 2
        s = sum(mid**i for i in range(1, budget + 1))
        lo, hi = (mid, hi) if s < target else (lo, mid)
    return lo


class Sim:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.method = a.method
        self.budget = int(a.budget or 0)
        self.speed = float(a.speed)
        self.active = 0
        self.total_tokens = 0
        self.requests = 0
        self.loading_left = int(getattr(a, "loading_requests", 0) or 0)
        self.truth: list[dict] = []
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos = [0] * max(self.budget, 1)
        self.spec = self.method in ("ddtree", "linear")
        self.tuning = read_tuning(a.tp, dict(os.environ), a.host_root, a.root)
        if self.spec:
            mean_len = (
                ACCEPT_LEN["linear"]
                if self.method == "linear"
                else ACCEPT_LEN["ddtree"].get(self.budget, 7.0)
            )
            self.p = accept_prob(mean_len * a.accept_scale, self.budget)

    # -- tokenizer ---------------------------------------------------------------------------
    @staticmethod
    def count(text: str) -> int:
        return len(text.split())

    def chat_tokens(self, messages) -> int:
        n = 3  # assistant header of the chat template
        for m in messages or []:
            c = m.get("content") or ""
            if isinstance(c, list):
                c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
            n += 4 + self.count(str(c))
        return n

    def rate(self, out_len: int, ctx: int) -> float:
        if self.a.rate:
            return float(self.a.rate) * self.speed
        active = 1 if self.a.no_contention else self.active
        # NCCL and MRRS slow every step evenly; NUMA balancing comes as stalls (numa_stall)
        return (
            decode_rate(self.method, self.budget, self.a.tp, out_len, active, ctx)
            * self.speed
            * self.tuning.factor(active, ("nccl", "mrrs"))
        )

    def mean_rate(self, out_len: int, ctx: int) -> float:
        """rate() with NUMA balancing's stalls averaged in (the non-streaming path)."""
        if self.a.rate:
            return self.rate(out_len, ctx)
        return self.rate(out_len, ctx) * self.tuning.factor(
            1 if self.a.no_contention else self.active, ("numa",)
        )

    def numa_stall(self, step_s: float, rng: random.Random) -> float:
        """Extra seconds for one decode step under NUMA balancing: a stall on NUMA_STALL_P of the
        steps, sized so the mean slowdown is the model's (jitter a client sees in its chunk gaps)."""
        if self.a.rate or self.tuning.severity["numa"] <= 0 or rng.random() >= NUMA_STALL_P:
            return 0.0
        slow = 1.0 / self.tuning.factor(1 if self.a.no_contention else self.active, ("numa",)) - 1.0
        return step_s * slow / NUMA_STALL_P

    def ttft(self, prompt_tokens: int) -> float:
        if self.a.ttft is not None:
            return self.a.ttft / self.speed
        return (TTFT_BASE_S + prompt_tokens / PREFILL_TOK_S[_tp_key(self.a.tp)]) / self.speed

    def step_tokens(self, rng: random.Random) -> int:
        """Tokens one speculative step emits (1 + accepted draft tokens); counts vLLM's counters."""
        if not self.spec:
            return 1
        acc = 0
        while acc < self.budget and rng.random() < self.p:
            acc += 1
        self.drafts += 1
        self.draft_tokens += self.budget
        self.accepted += acc
        for i in range(acc):
            self.per_pos[i] += 1
        return 1 + acc

    def metrics(self) -> str:
        name = self.a.served_name
        lab = f'model_name="{name}",engine="0"'
        out = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lab}}} {self.active}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {self.total_tokens}.0",
        ]
        if self.spec:  # vLLM exposes these only when speculative decoding is configured
            for short, v in (
                ("num_drafts", self.drafts),
                ("num_draft_tokens", self.draft_tokens),
                ("num_accepted_tokens", self.accepted),
            ):
                out += [
                    f"# HELP vllm:spec_decode_{short}_total Number of spec decoding {short}.",
                    f"# TYPE vllm:spec_decode_{short}_total counter",
                    f"vllm:spec_decode_{short}_total{{{lab}}} {v}.0",
                ]
            out += [
                "# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.",
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            ]
            out += [
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}.0'
                for i, v in enumerate(self.per_pos)
            ]
        return "\n".join(out) + "\n"


# -- HTTP/1.1 on asyncio streams -------------------------------------------------------------------
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
}


async def _send(w: asyncio.StreamWriter, status: int, body: bytes, ctype="application/json") -> None:
    w.write(
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\ncontent-type: {ctype}\r\n"
        f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await w.drain()


def _err(message: str, code: int, typ: str = "BadRequestError") -> bytes:
    # vLLM's ErrorResponse shape
    return json.dumps(
        {"object": "error", "message": message, "type": typ, "param": None, "code": code}
    ).encode()


class Handler:
    def __init__(self, sim: Sim):
        self.sim = sim

    async def conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                hdrs = {}
                for ln in lines[1:]:
                    if ":" in ln:
                        k, v = ln.split(":", 1)
                        hdrs[k.strip().lower()] = v.strip()
                n = int(hdrs.get("content-length") or 0)
                body = await r.readexactly(n) if n else b""
                keep = await self.route(method, path.split("?")[0], body, w)
                if not keep or hdrs.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            try:
                w.close()
            except Exception:
                pass

    async def route(self, method: str, path: str, body: bytes, w) -> bool:
        s, a = self.sim, self.sim.a
        if path == "/health":
            await _send(w, 200, b"")
        elif path == "/v1/models" and a.models_list == "empty":
            # transformers serve 5.17 serving a local directory (read on the H200 device machine,
            # 2026-12-01): it lists Hugging Face cache repos only, so its own model is not there
            await _send(w, 200, json.dumps({"object": "list", "data": []}).encode())
        elif path == "/v1/models":
            await _send(
                w,
                200,
                json.dumps(
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": a.served_name,
                                "object": "model",
                                "created": int(time.time()),
                                "owned_by": "vllm",
                                "root": a.model,
                                "max_model_len": a.max_model_len,
                            }
                        ],
                    }
                ).encode(),
            )
        elif path == "/metrics":
            await _send(w, 200, s.metrics().encode(), "text/plain; version=0.0.4")
        elif path == "/sim/state":  # simulator only: the tuning state it saw at start and its effect
            await _send(
                w,
                200,
                json.dumps(
                    {
                        "simulator": "gpubox bench.simserver",
                        "method": s.method,
                        "budget": s.budget,
                        "tp": a.tp,
                        "speed": s.speed,
                        "tuning": s.tuning.to_dict(),
                    }
                ).encode(),
            )
        elif path == "/sim/truth":  # simulator only: what the server itself timed, per request
            await _send(w, 200, json.dumps(s.truth).encode())
        elif path == "/tokenize" and method == "POST":
            try:
                req = json.loads(body or b"{}")
            except ValueError:
                await _send(w, 400, _err("invalid JSON body", 400))
                return True
            if "messages" in req:
                count = s.chat_tokens(req["messages"])
            else:
                count = s.count(str(req.get("prompt", "")))
            await _send(
                w,
                200,
                json.dumps(
                    {"count": count, "max_model_len": a.max_model_len, "tokens": list(range(count))}
                ).encode(),
            )
        elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return await self.generate(path, body, w)
        else:
            await _send(w, 404, json.dumps({"detail": "Not Found"}).encode())
        return True

    async def generate(self, path: str, body: bytes, w) -> bool:
        """One completion request, as vLLM answers it: refused (the same status codes and error
        bodies), answered whole, or streamed at the simulated pace. False: the connection was
        dropped on purpose (the client must see a cut stream)."""
        t_recv = time.perf_counter()
        try:
            req = json.loads(body)
        except ValueError:
            await _send(w, 400, _err("invalid JSON body", 400))
            return True
        chat = path.endswith("chat/completions")
        refusal = self._refusal(req, chat)
        if refusal is not None:
            await _send(w, *refusal)
            return True
        r = self._reply(req, chat, t_recv)
        s = self.sim
        s.active += 1
        try:
            if not r.stream:
                await self._answer_whole(w, r)
                return True
            return await self._stream(w, r)
        finally:
            s.active -= 1

    def _refusal(self, req: dict, chat: bool) -> tuple[int, bytes] | None:
        """Why vLLM would refuse this request before generating (status, body), in its order:
        an engine failure, a model it does not serve (a server with an empty model list still
        serves its own name), a model still loading, a prompt + completion past max_model_len
        (vLLM's own message); None when it is served."""
        s, a = self.sim, self.sim.a
        if a.error_status:
            return a.error_status, _err("simulated engine failure", a.error_status, "InternalServerError")
        if a.models_list == "empty" and req.get("model") != a.served_name:
            return 404, _err(f"model {req.get('model')!r} not found", 404, "NotFoundError")
        if s.loading_left > 0:  # a lazy server: answers HTTP before its model is loaded
            s.loading_left -= 1
            return 503, _err("model is loading", 503, "ServiceUnavailableError")
        prompt_tokens, max_tokens = self._lengths(req, chat)
        if prompt_tokens + max_tokens > a.max_model_len:
            where = "messages" if chat else "prompt"
            msg = (
                f"This model's maximum context length is {a.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {where}, "
                f"{max_tokens} in the completion). Please reduce the length of the {where} or completion."
            )
            return 400, _err(msg, 400)
        return None

    def _lengths(self, req: dict, chat: bool) -> tuple[int, int]:
        """(prompt tokens, max_tokens) as the server counts them."""
        s = self.sim
        prompt_tokens = s.chat_tokens(req.get("messages")) if chat else s.count(str(req.get("prompt", "")))
        return prompt_tokens, int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)

    def _reply(self, req: dict, chat: bool, t_recv: float) -> "_Reply":
        """What this request will get: its id, how many tokens (EOS drawn from the request's own
        seeded stream unless ignore_eos), streamed or whole, with usage, with a thinking tag."""
        s, a = self.sim, self.sim.a
        prompt_tokens, max_tokens = self._lengths(req, chat)
        s.requests += 1
        rid = s.requests
        rng = random.Random(rid * 7919 + a.seed)
        n_target = max_tokens
        if not req.get("ignore_eos") and int(req.get("min_tokens") or 0) < max_tokens:
            n_target = max(int(req.get("min_tokens") or 1), min(max_tokens, rng.randint(200, 600)))
        return _Reply(
            chat=chat,
            cid=f"{'chatcmpl' if chat else 'cmpl'}-sim{rid:08d}",
            created=int(time.time()),
            model=a.served_name,
            user=req.get("user"),
            t_recv=t_recv,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            n_target=n_target,
            stream=bool(req.get("stream")),
            usage_on=bool((req.get("stream_options") or {}).get("include_usage")),
            thinking=bool((req.get("chat_template_kwargs") or {}).get("enable_thinking", False)),
            rng=rng,
            stall_rng=random.Random(rid * 104729 + a.seed),  # own stream: stalls leave acceptance alone
        )

    async def _answer_whole(self, w, r: "_Reply") -> None:
        """Non-streaming: wait the whole generation, answer once."""
        s = self.sim
        await asyncio.sleep(
            s.ttft(r.prompt_tokens) + (r.n_target - 1) / s.mean_rate(r.n_target, r.prompt_tokens)
        )
        s.total_tokens += r.n_target
        text = " tok" * r.n_target
        d = {
            "id": r.cid,
            "object": "chat.completion" if r.chat else "text_completion",
            "created": r.created,
            "model": r.model,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": r.finish,
                    **({"message": {"role": "assistant", "content": text}} if r.chat else {"text": text}),
                }
            ],
            "usage": r.usage(r.n_target),
        }
        await _send(w, 200, json.dumps(d).encode())

    async def _stream(self, w, r: "_Reply") -> bool:
        """Server-sent events at the simulated pace: the first token after prefill, then steps of
        accepted tokens on absolute deadlines (pacing never drifts), the faults the server was
        started with (crash, hang, dropped connection), usage, [DONE]; then the truth record."""
        s, a = self.sim, self.sim.a
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        if r.chat:
            w.write(r.chunk(None, role=True))
        await w.drain()
        t_next = r.t_recv + s.ttft(r.prompt_tokens)
        plan_first = t_next
        stamps: dict[str, float] = {}
        emitted = 0
        while emitted < r.n_target:
            first = emitted == 0
            if first:
                n = 1  # the prefill step yields exactly one token
            else:
                n = min(s.step_tokens(r.rng), r.n_target - emitted)
                step_s = n / s.rate(r.n_target, r.prompt_tokens)
                t_next += step_s + s.numa_stall(step_s, r.stall_rng)
            delay = t_next - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if a.die_after is not None and s.total_tokens + n > a.die_after:
                sys.stdout.write("ERROR simulated engine crash: EngineCore died unexpectedly\n")
                sys.stdout.flush()
                os._exit(3)
            if a.hang_after is not None and emitted >= a.hang_after:
                await asyncio.sleep(3600)
            if a.close_after is not None and emitted >= a.close_after:
                w.transport.abort()  # drop the connection mid-stream, no terminating chunk
                return False
            piece = ("<think>" if (r.thinking and first) else "") + " tok" * n
            data = r.chunk(piece, r.finish if emitted + n >= r.n_target else None)
            # truth = the moment the token is handed to the socket (transport.write sends at
            # once), stamped before the write so a preemption after it cannot make it late
            now = time.perf_counter()
            w.write(data)
            wrote = time.perf_counter()  # loopback: the client's kernel stamp lies in between
            await w.drain()
            if first:
                stamps["t_first"], stamps["t_first_written"] = now, wrote
            stamps["t_last"], stamps["t_last_written"] = now, wrote
            emitted += n
            s.total_tokens += n
        if r.usage_on:
            w.write(r.chunk(None, usage=r.usage(emitted)))
        done = b"data: [DONE]\n\n"
        w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        stamps["t_end_written"] = time.perf_counter()  # after the body's last byte (usage, [DONE])
        await w.drain()
        self._record(r, stamps, emitted, plan_first, t_next)
        return True

    def _record(self, r: "_Reply", stamps: dict, emitted: int, plan_first: float, plan_last: float) -> None:
        """The server's truth for one streamed request: when each token really left, and when
        the simulator meant to send the first and last one. Sent later than planned = the
        machine could not keep the pace (load), which tests measure instead of assuming a margin."""
        s, a = self.sim, self.sim.a
        s.truth.append(
            {
                "id": r.cid,
                "user": r.user,
                "t_recv": r.t_recv,
                "t_first": stamps["t_first"],
                "t_last": stamps["t_last"],
                "t_first_written": stamps["t_first_written"],
                "t_last_written": stamps["t_last_written"],
                "t_end_written": stamps["t_end_written"],
                "ttft_s": stamps["t_first"] - r.t_recv,
                "e2e_s": stamps["t_last"] - r.t_recv,
                "output_tokens": emitted,
                "prompt_tokens": r.prompt_tokens,
                "plan_ttft_s": plan_first - r.t_recv,
                "plan_e2e_s": plan_last - r.t_recv,
            }
        )
        if a.truth_file:
            with open(a.truth_file, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({**s.truth[-1], "tp": a.tp, "method": a.method}) + "\n")


@dataclass
class _Reply:
    """One admitted request: what it asked and what the simulator will answer."""

    chat: bool
    cid: str
    created: int
    model: str
    user: Any
    t_recv: float
    prompt_tokens: int
    max_tokens: int
    n_target: int
    stream: bool
    usage_on: bool
    thinking: bool
    rng: random.Random
    stall_rng: random.Random

    @property
    def finish(self) -> str:
        return "length" if self.n_target == self.max_tokens else "stop"

    def usage(self, completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def chunk(self, text: str | None, finish=None, usage=None, role=False) -> bytes:
        """One SSE event in one HTTP chunk, shaped as vLLM's (chat delta or completion text)."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {"content": text}
            ch = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        else:
            ch = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        d = {
            "id": self.cid,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [] if usage else ch,
        }
        if usage:
            d["usage"] = usage
        data = b"data: " + json.dumps(d, separators=(",", ":")).encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpubox.simbox.simserver",
        description="gpubox SIMULATOR of a vLLM OpenAI-compatible server (no GPU).",
    )
    p.add_argument("--model", default="/dev/shm/Qwen3.6-27B")
    p.add_argument("--served-model-name", dest="served_name", default=None)
    p.add_argument(
        "--models-list",
        choices=["full", "empty"],
        default="full",
        help="empty: /v1/models lists nothing and only the named model is served (transformers serve 5.17)",
    )
    p.add_argument(
        "--truth-file", default=None, help="append each request's /sim/truth record here (JSON lines)"
    )
    p.add_argument(
        "--loading-requests", type=int, default=0, help="answer the first N generation requests 503 (loading)"
    )
    p.add_argument("--drafter", default="")
    p.add_argument("--method", choices=["auto", "linear", "ddtree"], default="auto")
    p.add_argument("--budget", type=int, default=15)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--speed", type=float, default=1.0, help="multiply every simulated rate by this")
    p.add_argument(
        "--rate", type=float, default=None, help="fixed decode tok/s (before --speed): exact timing"
    )
    p.add_argument("--ttft", type=float, default=None, help="fixed time to first token, s (before --speed)")
    p.add_argument("--no-contention", action="store_true", help="concurrent streams do not slow each other")
    p.add_argument("--accept-scale", type=float, default=1.0, help="scale mean acceptance length (tests)")
    p.add_argument("--startup-s", type=float, default=0.2, help="simulated model load time before listening")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--host-root",
        default=None,
        help="root of the (simulated) host whose tuning to model: sysfs PCI config, numa_balancing",
    )
    p.add_argument("--root", default=None, help="the server's own root, for /etc/nccl.conf and ~/.nccl.conf")
    p.add_argument(
        "--fail-start", action="store_true", help="exit 1 during start-up like a CUDA init failure"
    )
    p.add_argument("--die-after", type=int, default=None, help="crash after N generated tokens in total")
    p.add_argument("--hang-after", type=int, default=None, help="stop sending after N tokens of a request")
    p.add_argument("--error-status", type=int, default=None, help="answer completions with this HTTP status")
    p.add_argument("--close-after", type=int, default=None, help="drop each stream after N tokens")
    p.add_argument("--spawn-child", action="store_true", help="start a worker child like vLLM's EngineCore")
    a = p.parse_args(argv)
    a.served_name = a.served_name or a.model
    if a.method == "auto":
        a.budget = 0
    return a


async def _serve(a: argparse.Namespace) -> None:
    sim = Sim(a)
    print(f"INFO gpubox SIMULATED tuning state: {sim.tuning.summary()}", flush=True)
    for note in sim.tuning.notes:
        print(f"WARNING gpubox SIMULATED tuning state: {note}", flush=True)
    server = await asyncio.start_server(Handler(sim).conn, a.host, a.port, limit=1 << 22, backlog=256)
    print(f"INFO:     Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)", flush=True)
    async with server:
        await server.serve_forever()


def main(argv=None) -> int:
    a = parse(argv)
    print(
        f"INFO gpubox SIMULATED vLLM server: model={a.model} method={a.method} budget={a.budget} "
        f"tp={a.tp} max_model_len={a.max_model_len} speed={a.speed}",
        flush=True,
    )
    child = None
    if a.spawn_child:  # a grandchild process, like vLLM's EngineCore/worker processes
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"INFO EngineCore worker pid={child.pid}", flush=True)
    time.sleep(a.startup_s / max(a.speed, 1.0))
    if a.fail_start:
        print(
            "ERROR RuntimeError: CUDA error: unknown error (simulated start-up failure)\n"
            "ERROR Engine core initialization failed. See root cause above.",
            flush=True,
        )
        return 1
    if a.tp > 1 and a.host_root:  # NCCL initialises communicators only with more than one rank
        fatal = nccl_fatal(nccl_settings(dict(os.environ), Path(a.root) if a.root else None))
        if fatal:
            print(
                f"ERROR NCCL WARN {fatal} (simulated)\nERROR RuntimeError: NCCL error: invalid usage "
                "(run with NCCL_DEBUG=WARN for details)\n"
                "ERROR Engine core initialization failed. See root cause above.",
                flush=True,
            )
            return 1
    try:
        asyncio.run(_serve(a))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
