"""Streaming load client for OpenAI-compatible servers (vLLM, SGLang, the simulator).

Measured the way vLLM's benchmarks/serve.py and GuideLLM measure (FACTS "Serving benchmarks"):
output tokens come from the server's `usage.completion_tokens` (`stream_options.include_usage`),
never from chunk counts, because a speculative step sends several tokens in one SSE chunk;
TPOT = (E2E - TTFT) / (n - 1). Every failure (HTTP 4xx/5xx, a stream that ends without usage or
[DONE], a read that stalls past the timeout, a refused connection) becomes a failed Sample with a
one-line reason; nothing here can hang past its deadline.

httpx (already a dependency) rather than aiohttp; lines are split by hand from raw bytes and only
the chunks that matter (the first content chunk, the usage chunk) are JSON-parsed, which keeps the
client's CPU per streamed token low. Under httpx's pool sits bench.clientnet's socket layer, which
stamps bytes when they leave the socket: TTFT and E2E are those stamps, not the time the task got
round to parsing them (at 64 streams that was 13 ms late; see docs/bench.md "Measurement quality").
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.clientnet import arrival, timed_transport
from gpubox.errors import GpuboxError

WORDS = ("the of and to in is was for on that with as by at from his it an were are which this be "
         "or has had not but after first new who they have her she two their its one been all also "
         "into other more time over year some only most when can would there made many part city "
         "world state during both three later under then about").split()


@dataclass
class Sample:
    """One request as the client saw it. Figures are None when the request failed."""

    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    chunks: int = 0
    error: str | None = None
    rep: int = 0
    started: float = 0.0  # perf_counter at send, for aggregate wall times

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def tok_s(self) -> float | None:
        t = self.tpot_s
        return 1.0 / t if t else None

    @property
    def tokens_per_chunk(self) -> float | None:
        return self.output_tokens / self.chunks if self.ok and self.chunks else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("started")
        for k in ("ttft_s", "e2e_s"):
            if d[k] is not None:
                d[k] = round(d[k], 6)
        return d


@dataclass
class Request:
    """What to send. `prompt` for /v1/completions, `messages` for /v1/chat/completions."""

    max_tokens: int
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    temperature: float = 0.0
    ignore_eos: bool = True
    thinking: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def payload(self, model: str) -> dict[str, Any]:
        p: dict[str, Any] = {"model": model, "max_tokens": self.max_tokens, "stream": True,
                             "stream_options": {"include_usage": True},
                             # explicit: server defaults come from generation_config.json (FACTS)
                             "temperature": self.temperature}
        if self.ignore_eos:  # fixed output length (vLLM sampling params)
            p["ignore_eos"] = True
            p["min_tokens"] = self.max_tokens
        if self.chat:
            p["messages"] = self.messages
            if self.thinking is not None:
                p["chat_template_kwargs"] = {"enable_thinking": bool(self.thinking)}
        else:
            p["prompt"] = self.prompt
        p.update(self.extra)
        return p


class ServerInfo:
    """What the client learned about the server: model id and context window."""

    def __init__(self, model: str, max_model_len: int | None):
        self.model, self.max_model_len = model, max_model_len


def _line_error(body: bytes, status: int) -> str:
    try:
        d = json.loads(body)
        msg = d.get("message") or (d.get("error") or {}).get("message") or d.get("detail") or body[:200].decode()
    except Exception:
        msg = body[:200].decode(errors="replace").strip() or "no body"
    return f"HTTP {status}: {' '.join(str(msg).split())}"


class Client:
    """One connection pool to one server. Use as `async with Client(url) as c:`."""

    def __init__(self, base_url: str, *, timeout: float = 60.0, connect_timeout: float = 5.0,
                 max_connections: int = 256):
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            base_url=self.base, timeout=httpx.Timeout(timeout, connect=connect_timeout), limits=limits,
            transport=timed_transport(limits) if self.base.startswith("http://") else None)
        self.info: ServerInfo | None = None

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    # -- server facts ------------------------------------------------------------------------
    async def server_info(self) -> ServerInfo:
        if self.info is None:
            try:
                r = await self._http.get("/v1/models")
                r.raise_for_status()
                d = r.json()["data"][0]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
                raise GpuboxError(f"{self.base}/v1/models did not answer: {type(exc).__name__}: {exc}",
                                  "is an OpenAI-compatible server running at that URL?") from None
            self.info = ServerInfo(str(d["id"]), d.get("max_model_len"))
        return self.info

    async def tokenize(self, *, prompt: str | None = None, messages=None) -> tuple[int, int | None]:
        """(token count, max_model_len) from the server's own tokenizer."""
        info = await self.server_info()
        body: dict[str, Any] = {"model": info.model}
        body.update({"messages": messages} if messages is not None else {"prompt": prompt})
        r = await self._http.post("/tokenize", json=body)
        if r.status_code != 200:
            raise GpuboxError(f"{self.base}/tokenize failed: {_line_error(r.content, r.status_code)}",
                              "the server must expose /tokenize (vLLM does) to size prompts in tokens")
        d = r.json()
        return int(d["count"]), d.get("max_model_len") or info.max_model_len

    async def prompt_of(self, tokens: int, *, salt: int = 0) -> str:
        """A prompt of exactly `tokens` tokens as the server counts them (adjusted via /tokenize)."""
        n = max(tokens, 1)
        words = [WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n)]
        for _ in range(8):
            count, _ = await self.tokenize(prompt=" ".join(words))
            if count == tokens:
                return " ".join(words)
            diff = tokens - count
            if diff > 0:
                words += [WORDS[(len(words) + salt) % len(WORDS)] for _ in range(diff)]
            else:
                del words[max(len(words) + diff, 1):]
        raise GpuboxError(f"could not build a prompt of exactly {tokens} tokens (last {count})",
                          "the server's tokenizer merges words unexpectedly; report this")

    async def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Refuse before sending what the server would answer with HTTP 400 (FACTS: seed's 25k case)."""
        info = await self.server_info()
        mml = info.max_model_len
        if mml and prompt_tokens + max_tokens > mml:
            raise ContextTooLong(prompt_tokens, max_tokens, mml)

    # -- one streamed request ----------------------------------------------------------------
    async def stream(self, req: Request, *, rep: int = 0, deadline_s: float | None = None) -> Sample:
        """Send one streaming request; always returns a Sample (failed ones carry `error`)."""
        info = await self.server_info()
        path = "/v1/chat/completions" if req.chat else "/v1/completions"
        s = Sample(rep=rep)
        total = deadline_s or max(self.timeout * 4, 30.0)
        try:
            await asyncio.wait_for(self._stream(path, req.payload(info.model), s), timeout=total)
        except asyncio.TimeoutError:
            s.error = s.error or f"no complete answer within {total:.0f} s (server hung?)"
        except httpx.ReadTimeout:
            s.error = f"stream stalled: nothing received for {self.timeout:.0f} s after {s.chunks} chunks"
        except httpx.ConnectError as exc:
            s.error = f"cannot connect to {self.base}: {exc}"
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            s.error = f"connection closed mid-stream after {s.chunks} chunks ({type(exc).__name__})"
        except httpx.HTTPError as exc:
            s.error = f"{type(exc).__name__}: {exc}"
        if s.error:
            s.ttft_s = s.e2e_s = s.output_tokens = None
        return s

    async def _stream(self, path: str, payload: dict, s: Sample) -> None:
        t0 = time.perf_counter()
        s.started = t0
        first = None
        usage = None
        done = False
        buf = b""
        async with self._http.stream("POST", path, json=payload) as r:
            if r.status_code != 200:
                s.error = _line_error(await r.aread(), r.status_code)
                return
            async for raw in r.aiter_raw():
                buf += raw
                while True:
                    i = buf.find(b"\n")
                    if i < 0:
                        break
                    line, buf = buf[:i].rstrip(b"\r"), buf[i + 1:]
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        end = arrival(r)
                        continue
                    if b'"usage":{' in data or b'"usage": {' in data:
                        d = json.loads(data)
                        usage = d.get("usage") or usage
                        if not d.get("choices"):
                            continue
                    if first is None:
                        d = json.loads(data)
                        ch = (d.get("choices") or [{}])[0]
                        text = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                        reasoning = (ch.get("delta") or {}).get("reasoning_content")
                        if not (text or reasoning):
                            continue  # role-only / empty deltas carry no token yet
                        first = arrival(r)  # when these bytes left the socket, not now
                    s.chunks += 1
        if not done or usage is None:
            what = "no usage chunk" if usage is None else "no [DONE]"
            s.error = f"stream ended early after {s.chunks} chunks ({what})"
            return
        n = int(usage.get("completion_tokens") or 0)
        if n < 1 or first is None:
            s.error = "server returned no output tokens"
            return
        s.ttft_s, s.e2e_s, s.output_tokens = first - t0, end - t0, n
        s.prompt_tokens = usage.get("prompt_tokens")


class ContextTooLong(GpuboxError):
    def __init__(self, prompt_tokens: int, max_tokens: int, mml: int):
        super().__init__(
            f"prompt {prompt_tokens} + max_tokens {max_tokens} = {prompt_tokens + max_tokens} tokens "
            f"exceeds the server's max_model_len {mml} (the server would answer HTTP 400)",
            "start the server with a larger --max-model-len, or use a shorter prompt")
        self.prompt_tokens, self.max_tokens, self.max_model_len = prompt_tokens, max_tokens, mml


async def run_concurrent(client: Client, requests: list[Request], concurrency: int, *, rep: int = 0,
                         deadline_s: float | None = None) -> tuple[list[Sample], float]:
    """Send `requests` keeping `concurrency` in flight; returns samples and wall time (s)."""
    sem = asyncio.Semaphore(max(concurrency, 1))

    async def one(r: Request) -> Sample:
        async with sem:
            return await client.stream(r, rep=rep, deadline_s=deadline_s)

    t0 = time.perf_counter()
    samples = await asyncio.gather(*(one(r) for r in requests))
    return list(samples), time.perf_counter() - t0
