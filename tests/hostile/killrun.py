"""Run `gpubox ARGV...` and SIGKILL it at its K-th commit point (the kill oracle's runner).

    python -m tests.hostile.killrun K COUNT_FILE gpubox-argv...

A commit point is a rename/replace, an unlink/rmdir or an fsync made by gpubox's process, counted by
an audit hook (os.rename, os.remove, os.rmdir; fsync has no audit event, so os.fsync is wrapped
to raise one). K = 0 kills nothing and writes the number of commit points seen to COUNT_FILE.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

EVENTS = frozenset({"os.rename", "os.remove", "os.rmdir", "gpubox.fsync"})


def _pyc(args) -> bool:
    """Python's own bytecode cache write (a .pyc committed by os.replace), not gpubox's."""
    return any(isinstance(a, str) and "__pycache__" in a for a in args[:2])


def main() -> None:
    k, count_file, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    seen = [0]
    real_fsync = os.fsync

    def fsync(fd):
        sys.audit("gpubox.fsync", fd)
        return real_fsync(fd)

    def hook(event, args):
        if event in EVENTS and not _pyc(args):
            seen[0] += 1
            if seen[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)

    def report():
        with open(count_file, "w") as f:
            f.write(str(seen[0]))

    os.fsync = fsync
    sys.addaudithook(hook)
    if k == 0:
        atexit.register(report)
    from gpubox.cli import main as gpubox

    gpubox(argv)


if __name__ == "__main__":
    main()
