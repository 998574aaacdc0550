"""The simulated server's HTTP side: HTTP/1.1 on asyncio streams, the routes (/health, /v1/models,
/metrics, /tokenize, /sim/state, /sim/truth, /v1/completions, /v1/chat/completions), vLLM's
refusals and error bodies, and the answer to a completion: whole, or streamed as SSE at the pace
simserver_generation.py sets, with the failure switches the server was started with.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

from .simserver_generation import Reply, Sim
from .simserver_truth import record

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

    def _reply(self, req: dict, chat: bool, t_recv: float) -> Reply:
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
        return Reply(
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

    async def _answer_whole(self, w, r: Reply) -> None:
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

    async def _stream(self, w, r: Reply) -> bool:
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
        record(s, r, stamps, emitted, plan_first, t_next)
        return True
