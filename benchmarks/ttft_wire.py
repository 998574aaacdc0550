"""TTFT against the wire: gpubox, GuideLLM and `vllm bench serve` next to a packet capture (issue 19).

Truth from outside every client: a capture on loopback (`tcpdump -i lo`, or with --capture packet
a Python AF_PACKET socket with kernel timestamps where tcpdump is missing) on the server's port.
Per request, wire TTFT = the first server->client segment carrying a token minus the request's
first client->server segment (both stamped by the kernel's packet tap, so no client's queue or
event loop is in it). Each client's own TTFT median is compared with the median wire TTFT of its
own requests (the goal for gpubox: within 2% at every level).

Clients, one after another on the same server at each concurrency:
  gpubox       bench.client as `gpubox bench` uses it: kernel receive stamps (clientnet)
  gpubox-loop  the same with kernel stamps off (stamped in the event loop's read callback; the
               fallback where SO_TIMESTAMPNS is missing), to show what the kernel stamp removes
  plain        the reference a user would write: httpx streaming with perf_counter around it
  GuideLLM     GUIDELLM=/path/to/guidellm (or on PATH), 0.8 CLI
  vllm         VLLM=/path/to/vllm (`vllm bench serve --backend openai --dataset-name random`)
GuideLLM and vLLM need a tokenizer: a local one-word-one-token tokenizer is built with GuideLLM's
(or vLLM's) interpreter, as nothing can be fetched from a hub here.

Servers: gpubox's simulator (default: --no-contention, fixed 50 ms TTFT, one token per chunk,
2,000 tok/s over C streams), `--server guidellm-mock` (GuideLLM's mock-server, 50 ms TTFT, 10 ms
ITL), or `--url URL` for any running server.

    python benchmarks/ttft_wire.py [--conc 1,8,32] [--out 128] [--reps 1] [--nice -10]
                                   [--server sim|guidellm-mock | --url URL] [--tools ...] [--json] [--save F]

Needs root (or CAP_NET_RAW) for the capture. Exit 0 when gpubox is within 2% at every level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpubox.bench import clientnet  # noqa: E402
from gpubox.bench.client import Client, Request, run_concurrent  # noqa: E402
from gpubox.bench.launcher import Server, free_port  # noqa: E402

GOAL = 2.0
HDR = re.compile(r"^(\d+\.\d+) IP6? (\S+)\.(\d+) > (\S+)\.(\d+): .*length (\d+)")
TOKEN = re.compile(rb'"(?:text|content)": ?"[^"]')
REQUEST = b"POST /v1/"
TOOLS = ("gpubox", "gpubox-loop", "plain", "guidellm", "vllm")


USER = re.compile(rb'"user": ?"(ttft-\d+)"')


def wire_requests(pkts, port: int) -> list[tuple[float, float, str | None]]:
    """(request time, wire TTFT, user tag) per request, from (time, sport, dport, payload) packets."""
    out, req, tag = [], {}, {}
    for t, sport, dport, payload in pkts:
        if not payload:
            continue
        if dport == port:
            if REQUEST in payload:
                req[sport], tag[sport] = t, None  # the request's first segment
            m = USER.search(payload)
            if m and sport in req:
                tag[sport] = m.group(1).decode()
        elif sport == port and dport in req and TOKEN.search(payload):
            t0 = req.pop(dport)
            out.append((t0, t - t0, tag.pop(dport, None)))
    return sorted(out)


class Tcpdump:
    """tcpdump on loopback for one port, written to a pcap, read back as text (-A)."""

    def __init__(self, port: int, tmp: Path):
        self.port, self.pcap = port, tmp / f"cap-{port}-{time.monotonic_ns()}.pcap"

    def __enter__(self) -> "Tcpdump":
        # --immediate-mode: without it the last packets, still in a ring block, are lost at SIGINT
        argv = [
            "tcpdump",
            "-i",
            "lo",
            "-n",
            "-s",
            "0",
            "-U",
            "--immediate-mode",
            "-B",
            "16384",
            "-w",
            str(self.pcap),
            f"tcp port {self.port}",
        ]
        self.p = subprocess.Popen(argv, stderr=subprocess.PIPE)
        line = self.p.stderr.readline()  # "listening on lo ..." once it captures
        if b"listening" not in line:
            raise SystemExit(f"tcpdump did not start: {line.decode().strip()}")
        time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.3)
        self.p.send_signal(signal.SIGINT)
        err = self.p.communicate(timeout=10)[1].decode(errors="replace")
        m = re.search(r"(\d+) packets? dropped by kernel", err)
        self.dropped = int(m.group(1)) if m else None

    def ttfts(self) -> list[float]:
        self.requests = wire_requests(self.packets(), self.port)
        return [x for _, x, _ in self.requests]

    def packets(self) -> list[tuple[float, int, int, bytes]]:
        """(time, sport, dport, payload) per captured segment, in capture order."""
        txt = subprocess.run(
            ["tcpdump", "-r", str(self.pcap), "-n", "-tt", "-A", "-s", "0"],
            capture_output=True,
            errors="replace",
            text=True,
        ).stdout
        pkts, cur = [], None
        for line in txt.splitlines():
            m = HDR.match(line)
            if m:
                cur = [float(m.group(1)), int(m.group(3)), int(m.group(5)), int(m.group(6)), []]
                pkts.append(cur)
            elif cur is not None:
                cur[4].append(line)
        return [(t, sp, dp, "\n".join(body).encode() if n else b"") for t, sp, dp, n, body in pkts]


PACKET_CHILD = r"""
import socket, struct, sys, signal
port, path = int(sys.argv[1]), sys.argv[2]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS: the packet tap's own time, not ours
s.bind(("lo", 0))
stop = []
signal.signal(signal.SIGINT, lambda *a: stop.append(1))
s.settimeout(0.1)
out = open(path, "wb")
print("listening", flush=True)
while not stop:
    try:
        data, anc, _, addr = s.recvmsg(65600, socket.CMSG_SPACE(16))
    except (socket.timeout, InterruptedError):
        continue
    if addr[2] == 4 or len(data) < 34 or data[12:14] != b"\x08\x00":
        continue  # outgoing copy (lo shows each packet twice), not IPv4
    ihl = (data[14] & 15) * 4
    tcp = 14 + ihl
    if data[23] != 6:
        continue
    sp, dp = struct.unpack("!HH", data[tcp:tcp + 4])
    if port not in (sp, dp):
        continue
    off = tcp + (data[tcp + 12] >> 4) * 4
    sec, nsec = struct.unpack("@ll", anc[0][2])
    pay = data[off:]
    out.write(struct.pack("!dHHI", sec + nsec * 1e-9, sp, dp, len(pay)) + pay)
out.close()
"""


class PacketCapture(Tcpdump):
    dropped = None

    """Where tcpdump is missing: an AF_PACKET socket on lo in a child process (kernel timestamps)."""

    def __enter__(self) -> "PacketCapture":
        self.p = subprocess.Popen(
            [sys.executable, "-c", PACKET_CHILD, str(self.port), str(self.pcap)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        if b"listening" not in self.p.stdout.readline():
            raise SystemExit(f"packet capture did not start: {self.p.stderr.read().decode().strip()[-300:]}")
        return self

    def packets(self) -> list[tuple[float, int, int, bytes]]:
        raw, pkts, i = self.pcap.read_bytes(), [], 0
        while i < len(raw):
            t, sp, dp, n = struct.unpack_from("!dHHI", raw, i)
            i += 16
            pkts.append((t, sp, dp, raw[i : i + n]))
            i += n
        return pkts


def row(tool: str, own_ms: float | None, wire: list[float], cap=None, **extra) -> dict:
    """One client at one level: its own TTFT median next to the median wire TTFT of its requests."""
    if own_ms is None or not wire:
        return {"tool": tool, "status": extra.pop("status", None) or "no result", **extra}
    w = statistics.median(wire) * 1000
    return {
        "tool": tool,
        "status": "ok",
        "requests": len(wire),
        "ttft_ms": own_ms,
        "wire_ms": w,
        "err_pct": (own_ms - w) / w * 100,
        "wire_dropped": getattr(cap, "dropped", None),
        **extra,
    }


async def _gpubox(url: str, conc: int, n: int, out: int, cap, model: str | None = None):
    async with Client(url, timeout=60, model=model) as c:
        prompt = await c.prompt_of(16)
        await run_concurrent(c, [Request(8, prompt=prompt) for _ in range(conc)], conc)  # C open connections
        with cap:
            smp, _ = await run_concurrent(
                c, [Request(out, prompt=prompt, extra={"user": f"ttft-{i}"}) for i in range(n)], conc
            )
    return smp


def plain(url: str, model: str, conc: int, n: int, out: int, cap) -> dict:
    """The reference a user would write: httpx streaming, `time.perf_counter()` around each
    request, TTFT = the first SSE line that carries text (threads for concurrency)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    local = threading.local()

    def one(i: int) -> tuple[str, float | None]:
        h = getattr(local, "h", None) or httpx.Client(timeout=120)
        local.h = h
        body = {
            "model": model,
            "prompt": "a b c d e f g h",
            "max_tokens": out,
            "stream": True,
            "temperature": 0.0,
            "user": f"ttft-{i}",
        }
        t0 = time.perf_counter()
        with h.stream("POST", url + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    try:
                        ch = json.loads(line[6:])["choices"][0]
                    except (ValueError, KeyError, IndexError):
                        continue
                    if ch.get("text") or (ch.get("delta") or {}).get("content"):
                        return f"ttft-{i}", time.perf_counter() - t0
        return f"ttft-{i}", None

    with ThreadPoolExecutor(conc) as ex:  # warm the connections, outside the capture
        list(ex.map(lambda i: one(10_000 + i), range(conc)))
        with cap:
            got = list(ex.map(one, range(n)))
    cap.ttfts()
    by_tag = {u: w for _, w, u in cap.requests if u}
    pairs = [(t, by_tag[u]) for u, t in got if t is not None and u in by_tag]
    own = statistics.median(c for c, _ in pairs) * 1000 if pairs else None
    return row("plain", own, [w for _, w in pairs], cap, sent=n)


def gpubox(tool: str, url: str, conc: int, n: int, out: int, cap, model: str | None = None) -> dict:
    clientnet.KERNEL_STAMPS = tool == "gpubox"
    try:
        smp = asyncio.run(_gpubox(url, conc, n, out, cap, model))
    finally:
        clientnet.KERNEL_STAMPS = True
    bad = [s.error for s in smp if not s.ok]
    if bad:
        return row(tool, None, [], status=f"{len(bad)} failed: {bad[0]}")
    cap.ttfts()
    by_tag = {u: w for _, w, u in cap.requests if u}
    pairs = [(s.ttft_s, by_tag[f"ttft-{i}"]) for i, s in enumerate(smp) if f"ttft-{i}" in by_tag]
    # medians over the requests the capture saw (a capture that misses some would compare other sets)
    diffs = sorted((c - w) * 1000 for c, w in pairs)
    own = statistics.median(c for c, _ in pairs) * 1000 if pairs else None
    per = (
        {
            "p50": diffs[len(diffs) // 2],
            "p95": diffs[int(len(diffs) * 0.95)],
            "max": diffs[-1],
            "min": diffs[0],
        }
        if diffs
        else None
    )
    return row(
        tool,
        own,
        [w for _, w in pairs],
        cap,
        sent=len(smp),
        per_request_ms=per,
        send_wait_ms_p50=statistics.median(s.send_wait_s for s in smp) * 1000,
        send_wait_ms_max=max(s.send_wait_s for s in smp) * 1000,
        clock=dict(Counter(s.clock for s in smp)),
    )


def _tail(r: subprocess.CompletedProcess) -> str:
    lines = (r.stderr or r.stdout or "").strip().splitlines()
    return lines[-1][:200] if lines else ""


def guidellm(exe: str, tok: Path, url: str, model: str, conc: int, n: int, out: int, cap, tmp: Path) -> dict:
    outp = tmp / f"guidellm-{conc}-{time.monotonic_ns()}.json"
    cmd = [
        exe,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model={model}",
        "--profile",
        f"kind=concurrent,streams={conc}",
        "--constraint",
        f"kind=max_requests,count={n}",
        "--data",
        f"kind=synthetic_text,prompt_tokens=16,output_tokens={out}",
        "--tokenizer",
        f"kind=hf_auto,model={tok}",
        "--output",
        f"kind=json,path={outp}",
        "--disable-progress",
    ]
    with cap:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)
    if r.returncode != 0 or not outp.exists():
        return row("guidellm", None, [], status=f"failed rc={r.returncode}: {_tail(r)}")
    m = json.loads(outp.read_text())["benchmarks"][0]["metrics"]
    x = (m.get("time_to_first_token_ms") or {}).get("successful") or {}  # GuideLLM 0.8 nesting
    return row("guidellm", x.get("median"), cap.ttfts(), cap, sent=n)


def vllm(exe: str, tok: Path, url: str, model: str, conc: int, n: int, out: int, cap, tmp: Path) -> dict:
    name = f"vllm-{conc}-{time.monotonic_ns()}.json"
    cmd = [
        exe,
        "bench",
        "serve",
        "--backend",
        "openai",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        str(tok),
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        str(out),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(conc),
        "--ignore-eos",
        "--ready-check-timeout-sec",
        "0",  # no initial test request: n requests in all
        "--save-result",
        "--result-dir",
        str(tmp),
        "--result-filename",
        name,
        "--disable-tqdm",
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with cap:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    if r.returncode != 0 or not (tmp / name).exists():
        return row("vllm", None, [], status=f"failed rc={r.returncode}: {_tail(r)}")
    return row("vllm", json.loads((tmp / name).read_text()).get("median_ttft_ms"), cap.ttfts(), cap, sent=n)


def word_tokenizer(pythons: list[str], dest: Path) -> Path | None:
    """One word = one token (the simulator's rule), saved as a Hugging Face tokenizer directory."""
    from client_accuracy import word_tokenizer as code

    for py in pythons:
        if (
            py
            and Path(py).exists()
            and subprocess.run([py, "-c", code(dest), str(dest)], capture_output=True, timeout=300).returncode
            == 0
        ):
            return dest
    return None


def start_server(kind: str, conc: int, tmp: Path) -> Server:
    port = free_port()
    if kind == "sim":
        argv = [
            sys.executable,
            "-m",
            "gpubox.simbox.simserver",
            "--port",
            str(port),
            "--rate",
            str(min(2000.0 / conc, 500.0)),
            "--ttft",
            "0.05",
            "--no-contention",
            "--startup-s",
            "0",
        ]
    else:
        gl = os.environ.get("GUIDELLM") or shutil.which("guidellm")
        argv = [
            gl,
            "mock-server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "mock",
            "--ttft-ms",
            "50",
            "--itl-ms",
            "10",
        ]
    srv = Server(argv, {}, port=port, log_path=tmp / f"{kind}-{port}.log")
    srv.start()
    srv.wait_ready(60)
    return srv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conc", default="1,8,32")
    ap.add_argument("--out", type=int, default=128)
    ap.add_argument("--requests", type=int, default=0, help="per level (default max(24, 3*C))")
    ap.add_argument("--reps", type=int, default=1, help="repeat every level this many times")
    ap.add_argument("--server", choices=("sim", "guidellm-mock"), default="sim")
    ap.add_argument("--url", default=None, help="measure this running server instead")
    ap.add_argument(
        "--model", default=None, help="the model to ask for (servers whose /v1/models lists none)"
    )
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument(
        "--capture", choices=("tcpdump", "packet"), default="tcpdump" if shutil.which("tcpdump") else "packet"
    )
    ap.add_argument("--nice", type=int, default=0, help="nice value for this run and its children (root)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--save", type=Path, default=None, help="also write the JSON document here")
    a = ap.parse_args()
    if a.nice:
        os.setpriority(os.PRIO_PROCESS, 0, a.nice)
    cap_cls = Tcpdump if a.capture == "tcpdump" else PacketCapture
    tools = [t for t in a.tools.split(",") if t]
    gl = os.environ.get("GUIDELLM") or shutil.which("guidellm")
    vl = os.environ.get("VLLM") or shutil.which("vllm")
    load0 = os.getloadavg()[0]
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        tok = None
        if {"guidellm", "vllm"} & set(tools):
            tok = word_tokenizer([str(Path(x).with_name("python")) for x in (gl, vl) if x], tmp / "wordtok")
        for rep in range(a.reps):
            for conc in [int(x) for x in a.conc.split(",")]:
                n = a.requests or max(24, 3 * conc)
                srv = None if a.url else start_server(a.server, conc, tmp)
                url = a.url or srv.url
                port = urlsplit(url).port
                try:
                    model = None
                    for tool in tools:
                        cap = cap_cls(port, tmp)
                        if tool in ("gpubox", "gpubox-loop"):
                            r = gpubox(tool, url, conc, n, a.out, cap, a.model)
                        elif tool == "plain":
                            import httpx

                            try:
                                listed = httpx.get(url + "/v1/models", timeout=10).json().get("data") or []
                            except (httpx.HTTPError, ValueError):
                                listed = []
                            mid = a.model or (listed[0]["id"] if listed else None)
                            r = (
                                plain(url, mid, conc, n, a.out, cap)
                                if mid
                                else row(tool, None, [], status="no model")
                            )
                        else:
                            exe = gl if tool == "guidellm" else vl
                            if not exe or tok is None:
                                r = row(tool, None, [], status="not installed" if not exe else "no tokenizer")
                            else:
                                import httpx

                                model = model or httpx.get(url + "/v1/models").json()["data"][0]["id"]
                                r = (guidellm if tool == "guidellm" else vllm)(
                                    exe, tok, url, model, conc, n, a.out, cap, tmp
                                )
                        r.update(C=conc, rep=rep)
                        rows.append(r)
                        if tool == "gpubox":
                            ok &= r["status"] == "ok" and abs(r["err_pct"]) <= GOAL
                        if not a.json:
                            print(_line(r), flush=True)
                finally:
                    if srv:
                        srv.stop()
    load1 = os.getloadavg()[0]
    doc = json.dumps(
        {
            "server": a.url or a.server,
            "capture": a.capture,
            "out": a.out,
            "nice": a.nice,
            "cpus": len(os.sched_getaffinity(0)),
            "load_avg": [load0, load1],
            "rows": rows,
        },
        indent=1,
    )
    if a.save:
        a.save.write_text(doc)
    if a.json:
        print(doc)
    else:
        print(
            f"load avg {load0:.1f} -> {load1:.1f}; capture {a.capture}; goal: gpubox TTFT median within "
            f"{GOAL}% of the wire at every level: {'PASS' if ok else 'FAIL'}"
        )
    return 0 if ok else 1


def _line(r: dict) -> str:
    head = f"C={r['C']:<3} rep {r['rep']} {r['tool']:<12}"
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    s = (
        f"{head} n={r['requests']}/{r['sent']:<3} TTFT {r['ttft_ms']:8.2f} ms  wire {r['wire_ms']:8.2f} ms  "
        f"err {r['err_pct']:+6.2f}%"
    )
    if r.get("wire_dropped"):
        s += f"  (capture dropped {r['wire_dropped']} packets)"
    if "send_wait_ms_p50" in r:
        s += (
            f"  send wait p50/max {r['send_wait_ms_p50']:.2f}/{r['send_wait_ms_max']:.2f} ms"
            f"  clock {r['clock']}"
        )
        p = r.get("per_request_ms")
        if p:
            s += (
                f"  per request (client - wire) p50 {p['p50']:+.3f} p95 {p['p95']:+.3f} "
                f"max {p['max']:+.3f} ms"
            )
    return s


if __name__ == "__main__":
    sys.exit(main())
