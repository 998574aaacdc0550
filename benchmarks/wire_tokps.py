"""Decode tok/s against the wire: what a client reports next to what a loopback capture saw (issue 29).

Per response on the wire (one client->server segment carrying `POST /v1/` opens it, on its
connection): the first server->client segment that carries a token, the last server->client
segment with payload (the end of the body: `[DONE]`, or the chunked terminator where a server
sends none), and the output token count the server itself put in the stream (`usage`
completion_tokens; else the token-carrying SSE events counted in the payload). Wire decode tok/s
= (tokens - 1) / (last - first), the quantity `gpubox bench` and `vllm bench serve` call tok/s
((E2E - TTFT) / (n - 1), inverted), stamped by the kernel's packet tap instead of a client.

Used by benchmarks/interop.py (`--tokps`) against each real server it starts; the capture classes
are benchmarks/ttft_wire.py's (AF_PACKET with kernel stamps, or tcpdump).
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from ttft_wire import REQUEST, TOKEN, USER

USAGE_N = re.compile(rb'"completion_tokens": ?(\d+)')


def wire_streams(pkts, port: int) -> list[dict]:
    """One dict per response seen on the wire, in request order: t0 (request), first (first token
    segment), last (last payload segment), n (tokens), tok_s, tag (the request's `user` field)."""
    live, done = {}, []
    for t, sport, dport, payload in pkts:
        if not payload:
            continue
        if dport == port:
            if REQUEST in payload:
                if sport in live:
                    done.append(live.pop(sport))
                live[sport] = {"t0": t, "first": None, "last": None, "usage": None, "events": 0, "tag": None}
            m = USER.search(payload)
            if m and sport in live:
                live[sport]["tag"] = m.group(1).decode()
        elif sport == port and dport in live:
            s = live[dport]
            events = len(TOKEN.findall(payload))
            if events and s["first"] is None:
                s["first"] = t
            s["events"] += events
            s["last"] = t
            used = USAGE_N.findall(payload)
            if used:
                s["usage"] = int(used[-1])
    done += live.values()
    out = []
    for s in done:
        n = s["usage"] or s["events"]
        if s["first"] is None or n < 2 or s["last"] <= s["first"]:
            continue  # no decode on the wire (an error answer, a one-token probe)
        s["n"], s["tok_s"] = n, (n - 1) / (s["last"] - s["first"])
        out.append(s)
    return sorted(out, key=lambda s: s["t0"])


def med(xs):
    xs = [x for x in xs if x]
    return statistics.median(xs) if xs else None


def versus(name: str, own: list[float], wire: list[float], **extra) -> dict:
    """One client's per-request median tok/s next to the wire's over the same requests."""
    o, w = med(own), med(wire)
    return {
        "client": name,
        "requests": len(wire),
        "tok_s": o,
        "wire_tok_s": w,
        "ratio": o / w if o and w else None,
        **extra,
    }


def gpubox_vs_wire(measurement: dict, streams: list[dict]) -> dict:
    """gpubox's figures from its --json samples next to the wire's streams of the same run.

    The run is one gpubox process inside the capture, so its requests are the wire's streams of
    exactly `output_len` tokens (its warmup requests are shorter, see bench.workloads.WARMUP_TOKENS;
    a rejected-extras probe answers no tokens), in the same order."""
    n = measurement.get("output_len")
    smp = [s for s in measurement.get("samples") or [] if s.get("e2e_s") and s.get("ttft_s")]
    own = [
        (s["output_tokens"] - 1) / (s["e2e_s"] - s["ttft_s"])
        for s in smp
        if (s.get("output_tokens") or 0) >= 2 and s["e2e_s"] > s["ttft_s"]
    ]
    wire = [s["tok_s"] for s in streams if n is None or s["n"] == n]
    return versus(
        "gpubox",
        own,
        wire,
        headline_tok_s=measurement.get("tok_s"),
        samples=len(own),
        matched=len(own) == len(wire),
    )


def plain(url: str, model: str, conc: int, n: int, out: int, cap, timeout: float = 120) -> dict:
    """The reference a user would write: httpx streaming from threads, `time.perf_counter()` at the
    first SSE event that carries text and at the end of the stream; tokens from `usage` (asked for
    with stream_options), else the text events counted. Each request is tagged (`user`) so the
    wire's stream of the same request is the one compared."""
    local = threading.local()

    def one(i: int) -> tuple[str, float | None]:
        h = getattr(local, "h", None) or httpx.Client(timeout=timeout)
        local.h = h
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "a b c d e f g h"}],
            "max_tokens": out,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
            "user": f"ttft-{i}",
        }
        first, usage, events = None, None, 0
        with h.stream("POST", url + "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                try:
                    ch = json.loads(line[6:])
                except ValueError:
                    continue
                usage = (ch.get("usage") or {}).get("completion_tokens") or usage
                c = (ch.get("choices") or [{}])[0]
                if c.get("text") or (c.get("delta") or {}).get("content"):
                    events += 1
                    first = first or time.perf_counter()
        end = time.perf_counter()
        k = usage or events
        return f"ttft-{i}", (k - 1) / (end - first) if first and k >= 2 and end > first else None

    with ThreadPoolExecutor(conc) as ex:  # warm the connections, outside the capture
        list(ex.map(lambda i: one(10_000 + i), range(conc)))
        with cap:
            got = list(ex.map(one, range(n)))
    by_tag = {s["tag"]: s["tok_s"] for s in wire_streams(cap.packets(), cap.port) if s["tag"]}
    pairs = [(t, by_tag[u]) for u, t in got if t is not None and u in by_tag]
    return versus("plain", [o for o, _ in pairs], [w for _, w in pairs], sent=n)
