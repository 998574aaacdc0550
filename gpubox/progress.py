"""Live progress from work that runs on another host (a container over SSH or `pct exec`).

The remote side writes one JSON event per line on stderr, prefixed with PREFIX; the transport hands
each stderr line to a callback as it arrives (Transport.run(on_stderr=...)), and a relay here turns
the events back into the same calls a local run makes: start/advance/stop of the staging bar (bytes,
rate, ETA), step(desc, advance) of the benchmark bar. The remote side also sends an "alive" event at
least every ALIVE_S, so a silent remote means a hung one.

Events: {"ev": "start", "total": N, "desc": S} {"ev": "advance", "n": N} {"ev": "stop"}
        {"ev": "step", "desc": S, "advance": B} {"ev": "alive"}
provision/stage/progress.py (LineProgress) writes the same lines without importing this module: it is sent to
containers that have no gpubox installed.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Callable

PREFIX = "gpubox-progress "
ALIVE_S = 1.0


def encode(**event: Any) -> str:
    return PREFIX + json.dumps(event, separators=(",", ":"))


def parse(line: str) -> dict[str, Any] | None:
    """The event of a progress line, or None for any other stderr line."""
    if not line.startswith(PREFIX):
        return None
    try:
        ev = json.loads(line[len(PREFIX) :])
    except ValueError:
        return None
    return ev if isinstance(ev, dict) else None


def without_progress(stderr: str) -> str:
    """stderr minus the progress lines: what is left to show or to quote in an error."""
    return "\n".join(l for l in (stderr or "").splitlines() if not l.startswith(PREFIX))


class Relay:
    """on_stderr callback: progress events to `progress` (start/advance/stop) or `step(desc, advance)`;
    other lines to `other`. Keeps when each event arrived (`times`), for the tests' gap checks."""

    def __init__(
        self,
        progress=None,
        step: Callable[..., None] | None = None,
        other: Callable[[str], None] | None = None,
    ):
        self.progress, self.step, self.other = progress, step, other
        self.times: list[float] = []
        self.events: list[dict[str, Any]] = []
        self._started = False

    def __call__(self, line: str) -> None:
        ev = parse(line)
        if ev is None:
            if self.other is not None and line.strip():
                self.other(line)
            return
        self.times.append(time.monotonic())
        self.events.append(ev)
        kind = ev.get("ev")
        if kind == "start" and self.progress is not None:
            self.progress.start(int(ev.get("total") or 0), str(ev.get("desc") or ""))
            self._started = True
        elif kind == "advance" and self.progress is not None and self._started:
            self.progress.advance(int(ev.get("n") or 0))
        elif kind == "stop" and self.progress is not None and self._started:
            self.progress.stop()
            self._started = False
        elif kind == "step" and self.step is not None:
            self.step(str(ev.get("desc") or ""), bool(ev.get("advance", True)))

    def close(self) -> None:
        """Stop a bar the remote never stopped (it died mid-copy)."""
        if self._started and self.progress is not None:
            self.progress.stop()
            self._started = False


class Heartbeat:
    """Remote side: an "alive" line every ALIVE_S while a long step (a server launch) says nothing."""

    def __init__(self, stream=None, every: float = ALIVE_S):
        self.stream = stream or sys.stderr
        self.every = every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._last = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def emit(self, **event: Any) -> None:
        with self._lock:
            self.stream.write(encode(**event) + "\n")
            self.stream.flush()
            self._last = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.every / 2):
            if time.monotonic() - self._last >= self.every:
                try:
                    self.emit(ev="alive")
                except (OSError, ValueError):
                    return

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
