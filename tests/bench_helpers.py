"""Shared helpers for the bench tests: start the simulator as a real process via the launcher."""

from __future__ import annotations

import sys
from contextlib import contextmanager

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
