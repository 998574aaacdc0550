"""Shared helpers for the bench tests: start the simulator as a real process via the launcher."""

from __future__ import annotations

import fcntl
import json
import struct
import sys
import termios
import time
from contextlib import contextmanager
from pathlib import Path

from gpubox.bench.launcher import Server, free_port


@contextmanager
def simserver(tmp_path, *args: str, ready: bool = True):
    port = free_port()
    argv = [sys.executable, "-m", "gpubox.simbox.simserver", "--port", str(port), "--startup-s", "0", *args]
    s = Server(argv, {}, port=port, log_path=tmp_path / f"sim-{port}.log")
    s.start()
    try:
        if ready:
            s.wait_ready(timeout=20)
        yield s
    finally:
        s.stop()


LATE = 1.02  # the simulator sent a request's last token 2% later than it planned: the machine fell behind


def sim_lags(truth) -> list[float]:
    """Per request of the simulated server (its --truth-file): sent decode time / planned decode
    time, 1.0 = on its own schedule. Load shows here, not as a guess of a margin."""
    path = Path(truth)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        (r["e2e_s"] - r["ttft_s"]) / (r["plan_e2e_s"] - r["plan_ttft_s"])
        for r in rows
        if r["output_tokens"] > 1 and r["plan_e2e_s"] > r["plan_ttft_s"]
    ]


def fell_behind(sim) -> bool:
    """This machine could not keep the simulated server's pace (some request's decode took 2% longer
    than the simulator planned): a degraded verdict is then the client measuring that truthfully,
    not a wrong verdict. Tests that need a healthy verdict accept this one excuse, measured."""
    return max(sim_lags(sim.truth_path), default=1.0) > LATE


def unread(sock) -> int:
    """Bytes waiting in a socket's receive queue (FIONREAD), nothing consumed."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def wait_unread(sock, at_least: int, timeout: float = 10.0) -> float:
    """Block (an event loop that calls it too) until at least `at_least` bytes wait in the socket,
    and return that moment: a piece seen waiting arrived before it. The bound a test can trust for
    a kernel receive stamp: loopback's receipt may run after the sender's send call returned (in
    ksoftirqd, under load), so the send call's end is no upper bound."""
    deadline = time.perf_counter() + timeout
    while unread(sock) < at_least and time.perf_counter() < deadline:
        time.sleep(0.001)
    return time.perf_counter()
