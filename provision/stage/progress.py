"""Progress of a copy: a rich bar on a terminal, or gpubox.progress lines on stderr for a remote
copy (the control node relays them into its own bar)."""

from __future__ import annotations

import json
import sys
import threading
import time


class RichProgress:
    """Bytes, bytes/s and ETA with rich; start/advance/stop as stage() expects (thread-safe)."""

    def __init__(self, console=None):
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self._p = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task = None

    def start(self, total: int, description: str) -> None:
        self._p.start()
        self._task = self._p.add_task(description, total=total)

    def advance(self, n: int) -> None:
        self._p.advance(self._task, n)

    def stop(self) -> None:
        self._p.stop()


class LineProgress:
    """start/advance/stop as gpubox.progress lines on stderr: a remote stage's progress, which the
    control node relays into its own bar (bytes, rate, ETA). Stdlib only (this file is the payload).
    Advances are batched to a line per `every` s, and a line goes out at least every `alive` s even
    while no byte moves, so a quiet remote is a hung one."""

    PREFIX = "gpubox-progress "  # gpubox.progress.PREFIX

    def __init__(self, stream=None, every: float = 0.25, alive: float = 1.0):
        self.stream, self.every, self.alive = stream or sys.stderr, every, alive
        self._lock = threading.Lock()
        self._pending = 0
        self._last = 0.0
        self._done = threading.Event()
        self._thread = None

    def _emit(self, **ev) -> None:
        self.stream.write(self.PREFIX + json.dumps(ev, separators=(",", ":")) + "\n")
        self.stream.flush()
        self._last = time.monotonic()

    def _flush(self, force: bool) -> None:
        with self._lock:
            if self._pending or force:
                n, self._pending = self._pending, 0
                self._emit(ev="advance", n=n)

    def _tick(self) -> None:
        while not self._done.wait(self.every):
            self._flush(force=time.monotonic() - self._last >= self.alive)

    def start(self, total: int, description: str) -> None:
        with self._lock:
            self._emit(ev="start", total=int(total), desc=description)
        self._done.clear()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def advance(self, n: int) -> None:
        with self._lock:
            self._pending += n

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._flush(force=False)
        with self._lock:
            self._emit(ev="stop")


def rich_progress(console=None):
    """A RichProgress when rich is importable, else None (remote containers without rich)."""
    try:
        return RichProgress(console)
    except ImportError:
        return None
