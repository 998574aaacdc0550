"""How many tokens a prompt is, as the server will count it: the first counter that works.

1. The box's own tokenizer (the staged model directory's tokenizer.json, through `tokenizers`, else
   `transformers.AutoTokenizer`) when the caller gave one: no request at all.
2. The server's /tokenize in the shapes real servers use (issue 19, docs/facts.md "Real servers"):
   vLLM/SGLang `{model, prompt}` -> `{count}`; llama.cpp `{content}` -> `{tokens: [...]}`;
   TGI `{inputs}` -> `[{id, text, ...}, ...]`; GuideLLM's mock `{text}` -> `{tokens}`;
   llama-cpp-python (no /tokenize) `/extras/tokenize` `{input}` -> `{tokens}`.
   A shape counts only when its answer is a real count (an int, or a list), and only if it agrees
   with itself on a longer text; `{"count": "many"}` is no answer.
3. Calibration: a 1-token completion of the text and its `usage.prompt_tokens` (every
   OpenAI-compatible server that reports usage on non-streamed requests).

The chosen source is recorded (`Sizer.source`) and lands in the result document, so a figure sized
by calibration is never mistaken for one sized by the server's own tokenizer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpubox.errors import GpuboxError

PROBE = "the of and to in is was for on that with as by at from"


class LocalTokenizer:
    """A tokenizer loaded from a model directory (tokenizers' tokenizer.json, else AutoTokenizer)."""

    def __init__(self, encode, name: str):
        self._encode, self.name = encode, name

    def count(self, text: str, special: bool = True) -> int:
        return len(self._encode(text, special))

    @classmethod
    def load(cls, model_dir: str | Path | None) -> "LocalTokenizer | None":
        """None when there is no directory, no tokenizer in it, or no library to read it."""
        if not model_dir:
            return None
        d = Path(model_dir)
        tj = d / "tokenizer.json" if d.is_dir() else d
        try:
            from tokenizers import Tokenizer

            if tj.is_file():
                tok = Tokenizer.from_file(str(tj))
                return cls(lambda t, sp: tok.encode(t, add_special_tokens=sp).ids, f"tokenizers:{tj}")
        except ImportError:
            pass
        except Exception:  # a broken file: fall through to transformers, then to the server
            pass
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
            return cls(lambda t, sp: tok(t, add_special_tokens=sp)["input_ids"], f"transformers:{d}")
        except Exception:
            return None


def _from_answer(d: Any) -> int | None:
    """A token count from a /tokenize answer of any known shape, None when it is not one."""
    if isinstance(d, list):  # TGI: a list of token objects
        return len(d)
    if not isinstance(d, dict):
        return None
    c = d.get("count")
    if isinstance(c, int) and not isinstance(c, bool) and c >= 0:
        return c
    toks = d.get("tokens")
    if isinstance(toks, list):
        return len(toks)
    return None


SHAPES = (  # (name, path, body for a text); model id filled in where a server wants it
    ("vllm", "/tokenize", lambda model, t: {"model": model, "prompt": t}),
    ("llama.cpp", "/tokenize", lambda model, t: {"content": t, "add_special": True}),
    ("tgi", "/tokenize", lambda model, t: {"inputs": t}),
    ("text", "/tokenize", lambda model, t: {"text": t}),
    # llama-cpp-python 0.3.36 answers /tokenize 404 and counts at /extras/tokenize, with the BOS
    # its completions add (tests/fixtures/bench/realworld/llama-cpp-python-0.3.36-tokenize.json)
    ("llama-cpp-python", "/extras/tokenize", lambda model, t: {"input": t, "model": model}),
)


class Sizer:
    """Counts tokens for one Client with the first source that works; remembers the choice."""

    def __init__(self, client) -> None:
        self.c = client
        self.source: str | None = None
        self._fn = None
        self.tried: list[str] = []

    async def count(self, text: str) -> int:
        if self._fn is None:
            await self._choose()
        return await self._fn(text)

    async def _choose(self) -> None:
        tok = self.c.tokenizer
        if tok is not None:
            self.source, self._fn = f"local tokenizer ({tok.name})", self._local
            return
        info = await self.c.server_info()
        for name, path, shape in SHAPES:
            fn = self._tokenize_fn(info.model, path, shape)
            try:
                a, b = await fn(PROBE), await fn(PROBE + " " + PROBE)
            except Exception as exc:  # noqa: BLE001 - any odd answer only rules this shape out
                self.tried.append(f"{path} {name}: {type(exc).__name__}: {str(exc)[:80]}")
                continue
            if 0 < a < b <= 2 * a + 4:
                self.source, self._fn = f"server {path} ({name} shape)", fn
                return
            self.tried.append(f"{path} {name}: implausible counts {a}, {b}")
        try:
            a, b = await self._probe(PROBE), await self._probe(PROBE + " " + PROBE)
        except Exception as exc:  # noqa: BLE001
            self.tried.append(f"usage probe: {type(exc).__name__}: {str(exc)[:80]}")
            raise GpuboxError(
                "cannot size prompts in tokens: " + "; ".join(self.tried),
                "give the model's tokenizer (--tokenizer DIR) or a server with /tokenize or usage",
            ) from None
        if not 0 < a < b:
            raise GpuboxError(
                f"cannot size prompts: usage.prompt_tokens {a}, {b} for growing prompts",
                "give the model's tokenizer (--tokenizer DIR)",
            )
        self.source, self._fn = "usage.prompt_tokens of probe requests (calibration)", self._probe

    async def _local(self, text: str) -> int:
        return self.c.tokenizer.count(text)

    def _tokenize_fn(self, model: str, path: str, shape):
        async def fn(text: str) -> int:
            status, d, raw = await self.c.request_json("POST", path, shape(model, text))
            if status != 200:
                raise ValueError(f"HTTP {status}")
            n = _from_answer(d)
            if n is None:
                raise ValueError(f"no count in {raw[:60]!r}")
            return n

        return fn

    async def _probe(self, text: str) -> int:
        """Prompt tokens of `text` from a 1-token completion's usage."""
        info = await self.c.server_info()
        status, d, raw = await self.c.request_json(
            "POST",
            "/v1/completions",
            {"model": info.model, "prompt": text, "max_tokens": 1, "temperature": 0.0, "stream": False},
        )
        if status != 200:
            raise ValueError(f"HTTP {status}: {raw[:80]!r}")
        n = (d.get("usage") or {}).get("prompt_tokens") if isinstance(d, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"no usage.prompt_tokens in {raw[:80]!r}")
        return n
