"""The simulated server's generation: the tokenizer (one word, one token), the pace of each
request (time to first token, decode steps of accepted speculative tokens, NUMA-balancing stalls),
vLLM's counters on /metrics, and the shape of what it sends (a reply's SSE chunks and usage).
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import dataclass

from .simserver_rates import ACCEPT_LEN, PREFILL_TOK_S, TTFT_BASE_S, accept_prob, decode_rate, tp_key
from .simserver_tuning import NUMA_STALL_P, read_tuning


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
        return (TTFT_BASE_S + prompt_tokens / PREFILL_TOK_S[tp_key(self.a.tp)]) / self.speed

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


@dataclass
class Reply:
    """One admitted request: what it asked and what the simulator will answer."""

    chat: bool
    cid: str
    created: int
    model: str
    user: object  # the request's own `user` field, echoed in the truth record
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
