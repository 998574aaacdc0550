"""Streaming load client for OpenAI-compatible servers (vLLM, SGLang, the simulator).

One module (about 600 lines): the request loop, its timing and its token accounting measure one
request together.

Measured the way vLLM's benchmarks/serve.py and GuideLLM measure (docs/facts.md "Serving benchmarks"):
output tokens come from the server's `usage.completion_tokens` (`stream_options.include_usage`),
because a speculative step sends several tokens in one SSE chunk; a server that sends no usage
(llama-cpp-python, docs/facts.md "Real servers") is counted with the local tokenizer, else by chunks, and
the sample says which (`tokens_source`). TPOT = (E2E - TTFT) / (n - 1). TTFT starts when the request
is written to the socket and ends when the first token's bytes reached the socket, by the kernel's
receive timestamp where it gives one (bench.clientnet; `clock` says which), so a client busy with
other streams does not inflate it; the wait before the send is reported as `send_wait_s`.

Nothing about the server is assumed (issue 19): `ignore_eos`/`min_tokens` are dropped after a
400/422 that names them, a stream ends at `[DONE]` or at end of body after the `finish_reason`
chunk, prompts are sized by the first counter that works (bench.sizing). Every failure (HTTP error,
malformed JSON, a short answer, a body past its size bound, a stall, any exception) becomes a failed
Sample with a one-line reason; every phase has a deadline and every read a size bound.

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

from gpubox.bench.clientnet import arrival, clock, sent, timed_transport
from gpubox.errors import GpuboxError

WORDS = (
    "the of and to in is was for on that with as by at from his it an were are which this be "
    "or has had not but after first new who they have her she two their its one been all also "
    "into other more time over year some only most when can would there made many part city "
    "world state during both three later under then about"
).split()


MAX_JSON_BYTES = 1 << 20  # /v1/models, /tokenize, error bodies: more is not an API answer
MAX_LINE_BYTES = 1 << 20  # one SSE line
BYTES_PER_TOKEN = 16 << 10  # stream size bound: generous per token (logprobs etc.), never endless
EXTRAS = ("ignore_eos", "min_tokens")  # vLLM/SGLang sampling fields other servers may reject


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
    send_wait_s: float | None = None  # client-side wait between "send this" and bytes on the socket
    tokens_source: str | None = None  # usage | tokenizer | chunks (chunks: less exact)
    # "send/first token" stamps: send kernel | syscall (send() returned); first token kernel (receive
    # stamp) | kernel-late (read with later tokens: their arrival) | loop (read callback); read/read
    # for https (client's own clock)
    clock: str | None = None
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
        for k in ("ttft_s", "e2e_s", "send_wait_s"):
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

    def payload(self, model: str, extras: bool = True) -> dict[str, Any]:
        p: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            # explicit: server defaults come from generation_config.json (docs/facts.md)
            "temperature": self.temperature,
        }
        if self.ignore_eos and extras:  # fixed output length (vLLM sampling params)
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


class ModelNotNamed(GpuboxError):
    """A server answers but the model to ask for is not known (none listed, or not the one named)."""


class ServerInfo:
    """What the client learned about the server: model id and context window."""

    def __init__(self, model: str, max_model_len: int | None):
        self.model, self.max_model_len = model, max_model_len


class BadAnswer(Exception):
    """A server answer that breaks the protocol; its text is the Sample's reason."""


def _line_error(body: bytes, status: int) -> str:
    try:
        d = json.loads(body)
        err = d.get("error") if isinstance(d, dict) else None
        msg = (
            d.get("message")
            or (err.get("message") if isinstance(err, dict) else err)
            or d.get("detail")
            or body[:200].decode(errors="replace")
        )
    except Exception:
        msg = body[:200].decode(errors="replace").strip() or "no body"
    return f"HTTP {status}: {' '.join(str(msg).split())[:300]}"


def _int(v: Any, what: str) -> int:
    """A JSON count: an int (not a bool, not a string), >= 0."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadAnswer(f"{what} is {str(v)[:40]!r}, not a token count")
    return v


def _names_extras(status: int, body: bytes) -> bool:
    """A 400/422 that rejects one of our extra sampling fields (transformers serve: 422)."""
    return status in (400, 422) and any(f.encode() in body for f in EXTRAS)


def _body(r: httpx.Response):
    """The body as the server meant it: decoded when it says Content-Encoding (httpx offers gzip
    and deflate), the raw bytes otherwise (the stamps stay those of the socket reads). The bounds
    apply to the decoded bytes, so a small gzip bomb still stops at the limit."""
    enc = r.headers.get("content-encoding", "").strip().lower()
    return r.aiter_bytes() if enc and enc != "identity" else r.aiter_raw()


async def _read_bounded(r: httpx.Response, limit: int) -> bytes:
    buf = bytearray()
    async for part in _body(r):
        buf += part
        if len(buf) > limit:
            raise BadAnswer(f"answer larger than {limit >> 10} KiB")
    return bytes(buf)


class SSEReader:
    """The SSE body of one completion stream, fed as it arrives; raises BadAnswer on broken input.

    Written here rather than taken from an SSE library because the stamps matter: each feed comes
    with the time its bytes reached the socket, and the first content chunk takes that time.
    Bounded: `cap` bytes in all, MAX_LINE_BYTES per line."""

    def __init__(self, cap: int) -> None:
        self.cap, self.size, self.buf = cap, 0, b""
        self.first: float | None = None
        self.first_late = False  # first token read together with later ones (stamp: the later ones')
        self.end: float | None = None
        self.usage: dict | None = None
        self.done = self.finished = False
        self.chunks = 0
        # chunks that carry a token even when its text is "" (llama-cpp-python streams one chunk per
        # token and a special token decodes to ""; the finish chunk and a chat role chunk are none)
        self.token_chunks = 0
        self.text: list[str] = []

    def feed(self, raw: bytes, stamp) -> bool:
        """Take bytes; `stamp()` gives their arrival time. True once [DONE] was read."""
        self.size += len(raw)
        if self.size > self.cap:
            raise BadAnswer(f"stream larger than {self.cap >> 10} KiB (endless body?)")
        self.buf += raw
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                if len(self.buf) > MAX_LINE_BYTES:
                    raise BadAnswer(f"SSE line longer than {MAX_LINE_BYTES >> 10} KiB")
                return False
            line, self.buf = self.buf[:i].rstrip(b"\r"), self.buf[i + 1 :]
            if line.startswith(b"data:") and self._data(line[5:].strip(), stamp):
                return True

    def _data(self, data: bytes, stamp) -> bool:
        if data == b"[DONE]":
            self.done, self.end = True, stamp()
            return True
        try:
            d = json.loads(data)
        except ValueError:
            raise BadAnswer(
                f"malformed SSE data after {self.chunks} chunks: {data[:60].decode(errors='replace')!r}"
            ) from None
        if not isinstance(d, dict):
            raise BadAnswer(f"SSE data is not a JSON object: {data[:60].decode(errors='replace')!r}")
        if d.get("error"):
            raise BadAnswer(f"server error in stream: {' '.join(str(d['error']).split())[:200]}")
        if isinstance(d.get("usage"), dict):
            self.usage = d["usage"]
        choices = d.get("choices")
        ch = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = ch.get("delta") if isinstance(ch.get("delta"), dict) else {}
        text = ch.get("text") if "text" in ch else delta.get("content")
        reasoning = delta.get("reasoning_content")
        empty_token = isinstance(text, str) and not ch.get("finish_reason") and "role" not in delta
        if text or reasoning or empty_token:
            self.token_chunks += 1
        if text or reasoning:
            t = stamp()
            if self.first is None:
                self.first = t  # when these bytes left the socket, not now
            elif self.chunks == 1 and t == self.first:
                self.first_late = True  # one read brought the first and a later token: its stamp
            self.chunks += 1
            self.text.append(str(text or "") + str(reasoning or ""))
            self.end = t
        if ch.get("finish_reason"):
            self.finished, self.end = True, stamp()
        return False


class Client:
    """One connection pool to one server. Use as `async with Client(url) as c:`.

    `phase_timeout` bounds each whole control request (/v1/models, /tokenize, probes): a server
    that trickles a byte every few seconds never trips a per-read timeout, this one it does."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 60.0,
        connect_timeout: float = 5.0,
        max_connections: int = 256,
        phase_timeout: float = 30.0,
        tokenizer=None,
        model: str | None = None,
        fallback_model: str | None = None,
    ):
        self.base = base_url.rstrip("/")
        # `model`: the model the user named (--model): used in every request, and where the server
        # lists models it must be one of them. `fallback_model`: what the launcher started (its
        # path), used only where the server lists none (transformers serve lists HF-cache repos
        # only: a local directory gives {"data": []}).
        self.model, self.fallback_model = model, fallback_model
        self.timeout = timeout
        self.phase_timeout = phase_timeout
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            base_url=self.base,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=limits,
            transport=timed_transport(limits) if self.base.startswith("http://") else None,
        )
        self.info: ServerInfo | None = None
        self.tokenizer = tokenizer  # bench.sizing.LocalTokenizer or None
        self.extras_ok: bool | None = None  # None: not tried yet
        self.notes: list[str] = []  # capabilities learned, for the result document
        self.sizer = None  # bench.sizing.Sizer, made on first use

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # -- bounded control requests ----------------------------------------------------------------
    async def request_json(self, method: str, path: str, body: Any = None) -> tuple[int, Any, bytes]:
        """(status, parsed JSON or None, raw body) within phase_timeout and MAX_JSON_BYTES."""

        async def go():
            async with self._http.stream(method, path, json=body) as r:
                raw = await _read_bounded(r, MAX_JSON_BYTES)
                try:
                    return r.status_code, json.loads(raw), raw
                except ValueError:
                    return r.status_code, None, raw

        try:
            return await asyncio.wait_for(go(), self.phase_timeout)
        except asyncio.TimeoutError:
            raise BadAnswer(
                f"{method} {path}: no complete answer within {self.phase_timeout:.0f} s"
            ) from None

    # -- server facts ------------------------------------------------------------------------
    async def server_info(self) -> ServerInfo:
        """The model to ask for and its context window, from /v1/models.

        A server that lists no model (`{"data": []}`) or whose list fails (transformers serve 5.x
        answers 500 without a Hugging Face cache) is still usable when the model is named
        (`model` or `fallback_model`); requests then name it and the first one proves it."""
        if self.info is None:
            fix = "is an OpenAI-compatible server running at that URL?"
            named = self.model or self.fallback_model
            try:
                status, d, raw = await self.request_json("GET", "/v1/models")
            except (httpx.HTTPError, BadAnswer) as exc:
                if self.model and isinstance(exc, BadAnswer):
                    self.info = ServerInfo(self.model, None)
                    self.note(f"/v1/models gave no answer ({exc}); using the model named: {self.model}")
                    return self.info
                raise GpuboxError(
                    f"{self.base}/v1/models did not answer: {type(exc).__name__}: {exc}", fix
                ) from None
            if status != 200:
                if named and status >= 400:
                    self.info = ServerInfo(named, None)
                    self.note(f"/v1/models answered {status}; using the model named: {named}")
                    return self.info
                raise GpuboxError(f"{self.base}/v1/models answered {_line_error(raw, status)}", fix)
            models = self._model_list(d, raw, fix)
            if not models:
                if not named:
                    raise ModelNotNamed(
                        f"{self.base}/v1/models lists no model ({' '.join(raw[:60].decode(errors='replace').split())})",
                        "name the model the server loaded: --model NAME (e.g. the directory it serves)",
                    )
                self.info = ServerInfo(named, None)
                self.note(f"/v1/models lists no model; using the model named: {named}")
                return self.info
            if self.model:
                m = next((m for m in models if m[0] == self.model), None)
                if m is None:
                    raise ModelNotNamed(
                        f"{self.base} does not serve model {self.model!r} (it lists: "
                        f"{', '.join(x[0] for x in models[:5])})",
                        "give --model one of those, or leave --model out",
                    )
                self.info = ServerInfo(*m)
            else:
                self.info = ServerInfo(*models[0])
        return self.info

    def _model_list(self, d: Any, raw: bytes, fix: str) -> list[tuple[str, int | None]]:
        """(id, max_model_len) of each model in a /v1/models answer; a bad answer is an error."""
        try:
            out = []
            for m in d["data"]:
                model, mml = m["id"], m.get("max_model_len")
                if not isinstance(model, str) or not model:
                    raise TypeError("id is not a string")
                out.append((model, _int(mml, "max_model_len") if mml is not None else None))
            return out
        except (KeyError, IndexError, TypeError, AttributeError, BadAnswer) as exc:
            what = "not JSON" if d is None else f"no model list ({type(exc).__name__}: {exc})"
            head = " ".join(raw[:60].decode(errors="replace").split())
            raise GpuboxError(f"{self.base}/v1/models answered 200 but {what}: {head!r}", fix) from None

    async def count(self, text: str) -> int:
        """Tokens in `text` as the server counts them (bench.sizing picks how)."""
        if self.sizer is None:
            from .sizing import Sizer

            self.sizer = Sizer(self)
        return await self.sizer.count(text)

    async def prompt_of(self, tokens: int, *, salt: int = 0) -> str:
        """A prompt of `tokens` tokens as the server counts them: exactly where the tokenizer allows.

        Tokenizers differ in tokens per word (GuideLLM's mock counts each space: 2n-1 for n words),
        so the word count is found by bisection, then a short suffix closes an odd gap; when no
        prompt hits the count exactly, the nearest below within 1% is used and noted."""
        tokens = max(tokens, 1)

        def text(n: int) -> str:
            return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(max(n, 1)))

        lo, hi = 1, max(tokens, 1)
        c_hi = await self.count(text(hi))
        while c_hi < tokens and hi < 64 * tokens:  # fewer tokens than words: grow the bracket
            hi *= 2
            c_hi = await self.count(text(hi))
        best, best_c = None, -1
        while lo <= hi:  # the most words whose count is <= tokens
            mid = (lo + hi) // 2
            c = await self.count(text(mid))
            if c == tokens:
                return text(mid)
            if c < tokens:
                best, best_c, lo = mid, c, mid + 1
            else:
                hi = mid - 1
        if best is None:
            raise GpuboxError(
                f"cannot build a prompt of {tokens} tokens: one word is already more",
                "use a larger --prompt-len",
            )
        for suffix in (" ", ".", " a", ",", "\n", " ."):
            if await self.count(text(best) + suffix) == tokens:
                return text(best) + suffix
        if tokens - best_c <= max(1, tokens // 100):
            self.note(
                f"prompts sized to within 1% (e.g. {best_c} for {tokens}): the server's tokenizer "
                "cannot give every length"
            )
            return text(best)
        raise GpuboxError(
            f"could not build a prompt of {tokens} tokens (nearest {best_c})",
            "the server's tokenizer merges words unexpectedly; give --tokenizer DIR",
        )

    async def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Refuse before sending what the server would answer with HTTP 400 (docs/facts.md "The seed's story": the 25k case)."""
        info = await self.server_info()
        mml = info.max_model_len
        if mml and prompt_tokens + max_tokens > mml:
            raise ContextTooLong(prompt_tokens, max_tokens, mml)

    # -- one streamed request ----------------------------------------------------------------
    async def stream(self, req: Request, *, rep: int = 0, deadline_s: float | None = None) -> Sample:
        """Send one streaming request; always returns a Sample (failed ones carry `error`)."""
        s = Sample(rep=rep)
        total = deadline_s or max(self.timeout * 4, 30.0)
        try:
            info = await self.server_info()
            path = "/v1/chat/completions" if req.chat else "/v1/completions"
            await asyncio.wait_for(self._stream_adapting(path, req, info.model, s), timeout=total)
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
        except BadAnswer as exc:
            s.error = str(exc)
        except GpuboxError as exc:
            s.error = exc.problem if hasattr(exc, "problem") else str(exc)
        except Exception as exc:  # any surprise is this request's failure, never the run's
            s.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        if s.error:
            s.ttft_s = s.e2e_s = s.output_tokens = None
        return s

    async def _stream_adapting(self, path: str, req: Request, model: str, s: Sample) -> None:
        """Send with the extra sampling fields unless known unwelcome; retry once without them."""
        extras = req.ignore_eos and self.extras_ok is not False
        status = await self._stream(
            path, req.payload(model, extras), s, req.max_tokens, extras, req.ignore_eos
        )
        if status == "extras-rejected":
            self.extras_ok = False
            self.note(
                f"server rejected {'/'.join(EXTRAS)} ({s.error}); sent without them, so the "
                "model may stop early at EOS"
            )
            s.error, s.chunks = None, 0
            await self._stream(path, req.payload(model, False), s, req.max_tokens, False, req.ignore_eos)
        elif extras and s.ok:
            self.extras_ok = True

    async def _stream(
        self, path: str, payload: dict, s: Sample, asked: int, extras: bool, fixed: bool = True
    ) -> str | None:
        """One request. `fixed`: the caller asked for exactly `asked` tokens, so fewer is a failure."""
        t0 = time.perf_counter()
        s.started = t0
        cap = asked * BYTES_PER_TOKEN + MAX_JSON_BYTES
        async with self._http.stream("POST", path, json=payload) as r:
            t_sent = sent(r) or t0
            s.send_wait_s = max(t_sent - t0, 0.0)
            s.started = t_sent
            if r.status_code != 200:
                body = await _read_bounded(r, MAX_JSON_BYTES)
                s.error = _line_error(body, r.status_code)
                return "extras-rejected" if extras and _names_extras(r.status_code, body) else None
            rd = SSEReader(cap)
            async for raw in _body(r):
                if rd.feed(raw, lambda: arrival(r)):
                    break
                s.chunks = rd.chunks
        s.chunks = rd.chunks
        tx, rx = clock(r)
        s.clock = f"{tx}/{rx}{'-late' if rd.first_late and rx == 'kernel' else ''}"
        first, end, usage, text_parts = rd.first, rd.end, rd.usage, rd.text
        done, finished = rd.done, rd.finished
        if not (done or finished):
            s.error = f"stream ended early after {s.chunks} chunks (no [DONE], no finish_reason)"
            return None
        if first is None:
            s.error = "server returned no output tokens"
            return None
        n = self._output_tokens(usage, text_parts, s, rd.token_chunks, asked)
        s.ttft_s, s.e2e_s, s.output_tokens = first - t_sent, end - t_sent, n
        if n < 1:
            s.error = "server returned no output tokens"
        elif fixed and n < asked:
            why = "" if extras else " (ignore_eos not accepted by this server: the model stopped at EOS?)"
            s.error = f"short answer: {n} of {asked} tokens asked{why}"
        elif n > asked and s.tokens_source == "usage":
            s.error = f"server reported {n} tokens for max_tokens {asked}"
        return None

    def _output_tokens(
        self, usage: dict | None, text_parts: list[str], s: Sample, token_chunks: int, asked: int
    ) -> int:
        """usage.completion_tokens, else the local tokenizer over the text, else the chunk count.

        Without usage both fallbacks undercount (seen on llama-cpp-python 0.3.36, which streams one
        chunk per token: 64 tokens came as 59 chunks with text and 5 with "" for special tokens, and
        re-tokenizing the text merges pieces), so the larger of the two is taken, never above
        max_tokens (tests/fixtures/bench/realworld/llama-cpp-python-0.3.36-completions.sse)."""
        if usage is not None and usage.get("completion_tokens") is not None:
            s.tokens_source = "usage"
            if usage.get("prompt_tokens") is not None:
                s.prompt_tokens = _int(usage["prompt_tokens"], "usage.prompt_tokens")
            return _int(usage["completion_tokens"], "usage.completion_tokens")
        self.note(
            "server sends no usage in streams: output tokens counted "
            + ("with the local tokenizer" if self.tokenizer else "by chunks (less exact)")
        )
        if self.tokenizer is not None:
            s.tokens_source = "tokenizer"
            return min(max(self.tokenizer.count("".join(text_parts), special=False), token_chunks), asked)
        s.tokens_source = "chunks"
        return token_chunks


class ContextTooLong(GpuboxError):
    def __init__(self, prompt_tokens: int, max_tokens: int, mml: int):
        super().__init__(
            f"prompt {prompt_tokens} + max_tokens {max_tokens} = {prompt_tokens + max_tokens} tokens "
            f"exceeds the server's max_model_len {mml} (the server would answer HTTP 400)",
            "start the server with a larger --max-model-len, or use a shorter prompt",
        )
        self.prompt_tokens, self.max_tokens, self.max_model_len = prompt_tokens, max_tokens, mml


async def run_concurrent(
    client: Client,
    requests: list[Request],
    concurrency: int,
    *,
    rep: int = 0,
    deadline_s: float | None = None,
) -> tuple[list[Sample], float]:
    """Send `requests` keeping `concurrency` in flight; returns samples and wall time (s)."""
    sem = asyncio.Semaphore(max(concurrency, 1))

    async def one(r: Request) -> Sample:
        async with sem:
            return await client.stream(r, rep=rep, deadline_s=deadline_s)

    t0 = time.perf_counter()
    samples = await asyncio.gather(*(one(r) for r in requests))
    return list(samples), time.perf_counter() - t0
