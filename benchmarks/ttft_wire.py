"""TTFT against the wire: gpubox's client and GuideLLM next to a packet capture (issue 19).

Truth from outside every client: `tcpdump -i lo` on the server's port. Per request, wire TTFT =
the first server->client segment carrying a token minus the request's first client->server
segment (both kernel timestamps, so no client's queue or event loop is in it). The client's own
TTFT is compared median to median at each concurrency (the goal: within 2%); gpubox also reports
the time a request waited in the client before reaching the socket (`send_wait_s`), which is what
used to inflate its TTFT under load.

Server: gpubox's simulator (--no-contention, fixed 50 ms TTFT, one token per chunk), or
`--url URL` for any running server (e.g. GuideLLM's mock-server, vLLM). GuideLLM runs the same
load when installed (GUIDELLM=/path/to/guidellm); its wire truth is captured separately.

    python benchmarks/ttft_wire.py [--conc 1,8,32] [--out 128] [--url URL] [--json]

Needs root (or CAP_NET_RAW) for tcpdump. Exit 0 when gpubox is within 2% at every level.
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
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpubox.bench.client import Client, Request, run_concurrent  # noqa: E402
from gpubox.bench.launcher import Server, free_port  # noqa: E402

GOAL = 2.0
HDR = re.compile(r"^(\d+\.\d+) IP6? (\S+)\.(\d+) > (\S+)\.(\d+): .*length (\d+)")
TOKEN = re.compile(r'"(?:text|content)": ?"[^"]')


class Capture:
    """tcpdump on loopback for one port, written to a pcap, read back as text (-A)."""

    def __init__(self, port: int, tmp: Path):
        self.port, self.pcap = port, tmp / f"cap-{port}-{time.monotonic_ns()}.pcap"

    def __enter__(self) -> "Capture":
        self.p = subprocess.Popen(["tcpdump", "-i", "lo", "-n", "-s", "0", "-U", "-B", "16384", "-w", str(self.pcap),
                                   f"tcp port {self.port}"], stderr=subprocess.PIPE)
        line = self.p.stderr.readline()  # "listening on lo ..." once it captures
        if b"listening" not in line:
            raise SystemExit(f"tcpdump did not start: {line.decode().strip()}")
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.2)
        self.p.send_signal(signal.SIGINT)
        self.p.wait(10)

    def ttfts(self) -> list[float]:
        """Wire TTFT of every request in the capture (s)."""
        txt = subprocess.run(["tcpdump", "-r", str(self.pcap), "-n", "-tt", "-A", "-s", "0"],
                             capture_output=True, text=True, errors="replace").stdout
        pkts, cur = [], None
        for line in txt.splitlines():
            m = HDR.match(line)
            if m:
                cur = [float(m.group(1)), int(m.group(3)), int(m.group(5)), int(m.group(6)), []]
                pkts.append(cur)
            elif cur is not None:
                cur[4].append(line)
        out, req = [], {}
        for t, sport, dport, length, body in pkts:
            if length == 0:
                continue
            payload = "\n".join(body)
            if dport == self.port and "POST /v1/" in payload:
                req[sport] = t  # the request's first segment
            elif sport == self.port and dport in req and TOKEN.search(payload):
                out.append(t - req.pop(dport))
        return out



async def _gpubox(url: str, conc: int, n: int, out: int, cap_port: int, tmp: Path):
    async with Client(url, timeout=60) as c:
        prompt = await c.prompt_of(16)
        await run_concurrent(c, [Request(8, prompt=prompt) for _ in range(conc)], conc)  # C open connections
        with Capture(cap_port, tmp) as cap:
            smp, _ = await run_concurrent(c, [Request(out, prompt=prompt) for _ in range(n)], conc)
    bad = [s.error for s in smp if not s.ok]
    if bad:
        raise SystemExit(f"gpubox: {len(bad)} requests failed: {bad[0]}")
    return smp, cap.ttfts()


def guidellm(exe: str, url: str, model: str, conc: int, n: int, out: int, port: int, tmp: Path) -> dict:
    outp = tmp / f"guidellm-{conc}.json"
    cmd = [exe, "run", "--backend", f"kind=openai_http,target={url},model={model}",
           "--profile", f"kind=concurrent,streams={conc}", "--constraint", f"kind=max_requests,count={n}",
           "--data", f"kind=synthetic_text,prompt_tokens=16,output_tokens={out}",
           "--output", f"kind=json,path={outp}", "--disable-progress"]
    if os.environ.get("GUIDELLM_TOKENIZER"):
        cmd += ["--tokenizer", f"kind=hf_auto,model={os.environ['GUIDELLM_TOKENIZER']}"]
    with Capture(port, tmp) as cap:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp)
    if r.returncode != 0 or not outp.exists():
        return {"status": f"failed rc={r.returncode}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}"}
    m = json.loads(outp.read_text())["benchmarks"][0]["metrics"]
    ttft = _find(m, "time_to_first_token_ms")
    wire = cap.ttfts()
    return {"status": "ok", "ttft_ms": ttft, "wire_ms": statistics.median(wire) * 1000, "requests": len(wire)}


def _find(m: dict, name: str) -> float | None:
    """GuideLLM 0.8 nests metric -> successful -> median."""
    x = m.get(name) or {}
    x = x.get("successful", x) if isinstance(x, dict) else {}
    return x.get("median") if isinstance(x, dict) else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conc", default="1,8,32")
    ap.add_argument("--out", type=int, default=128)
    ap.add_argument("--requests", type=int, default=0, help="per level (default max(24, 3*C))")
    ap.add_argument("--url", default=None, help="measure this server instead of starting the simulator")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not shutil.which("tcpdump"):
        print("tcpdump not installed (apt-get install tcpdump)", file=sys.stderr)
        return 2
    exe = os.environ.get("GUIDELLM") or shutil.which("guidellm")
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for conc in [int(x) for x in a.conc.split(",")]:
            n = a.requests or max(24, 3 * conc)
            srv = None
            url = a.url
            if not url:
                port = free_port()
                srv = Server([sys.executable, "-m", "gpubox.bench.simserver", "--port", str(port), "--rate",
                              str(min(2000.0 / conc, 500.0)), "--ttft", "0.05", "--no-contention", "--startup-s", "0"],
                             {}, port=port, log_path=tmp / f"sim-{port}.log")
                srv.start()
                srv.wait_ready(30)
                url = srv.url
            port = urlsplit(url).port
            try:
                smp, wire = asyncio.run(_gpubox(url, conc, n, a.out, port, tmp))
                g_ms = statistics.median(s.ttft_s for s in smp) * 1000
                w_ms = statistics.median(wire) * 1000
                row = {"C": conc, "requests": n, "wire_ms": w_ms, "gpubox_ms": g_ms,
                       "gpubox_err_pct": (g_ms - w_ms) / w_ms * 100,
                       "send_wait_ms_p50": statistics.median(s.send_wait_s for s in smp) * 1000,
                       "send_wait_ms_max": max(s.send_wait_s for s in smp) * 1000}
                ok &= abs(row["gpubox_err_pct"]) <= GOAL
                if exe:
                    import httpx
                    model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
                    row["guidellm"] = guidellm(exe, url, model, conc, n, a.out, port, tmp)
            finally:
                if srv:
                    srv.stop()
            rows.append(row)
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'C':>3} {'n':>4} | {'wire TTFT':>9} {'gpubox':>8} {'err%':>6} {'send wait p50/max':>18} |"
              f" {'GuideLLM':>8} {'its wire':>8} {'err%':>6}")
        for r in rows:
            g = r.get("guidellm") or {}
            gl = (f"{g['ttft_ms']:>8.2f} {g['wire_ms']:>8.2f} {(g['ttft_ms'] - g['wire_ms']) / g['wire_ms'] * 100:>+6.1f}"
                  if g.get("status") == "ok" else (g.get("status") or "not installed"))
            print(f"{r['C']:>3} {r['requests']:>4} | {r['wire_ms']:>9.2f} {r['gpubox_ms']:>8.2f} "
                  f"{r['gpubox_err_pct']:>+6.2f} {r['send_wait_ms_p50']:>8.2f}/{r['send_wait_ms_max']:<9.2f} | {gl}")
        print(f"goal: gpubox TTFT median within {GOAL}% of the wire: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
