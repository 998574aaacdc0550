"""How many copy threads, and how a batch of tasks runs on them (first failure stops the rest)."""

from __future__ import annotations

import os
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait


def cpu_count() -> int:
    """CPUs this process may run on (taskset/cpuset), not the machine's: os.cpu_count() counts all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def default_workers() -> int:
    """Copy threads: the CPUs this process may use, 2..16 (GPUBOX_STAGE_WORKERS sets it: the
    benchmark's variants time other counts with the same engine)."""
    try:
        return max(1, int(os.environ["GPUBOX_STAGE_WORKERS"]))
    except (KeyError, ValueError):
        return max(2, min(16, cpu_count()))


def run_tasks(tasks, workers: int, abort=None) -> None:
    """Run callables on a thread pool; the first failure (or an interrupt) cancels what has not
    started, tells the running ones to stop (`abort()`), waits for them, and is raised."""
    ex = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stage")
    try:
        futs = [ex.submit(t) for t in tasks]
        wait(futs, return_when=FIRST_EXCEPTION)
    finally:
        if abort is not None:
            abort()
        ex.shutdown(wait=True, cancel_futures=True)
    for f in futs:
        if f.done() and not f.cancelled() and f.exception() is not None:
            raise f.exception()
