"""The simulated hosts' `python3` stand-in (built by gpubox.simbox.cuda, first on their PATH).

It runs every command with the python3 that comes next on PATH, unchanged, except the CUDA probe's
payload in the container, which gpubox.simbox.cuda answers from the simulated state. A module of
its own that imports little: the stand-in starts for every payload run on a simulated box, and the
simulated CUDA is loaded only for the probe.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = "gpubox.provision.cuda_probe"


def main() -> None:
    argv = sys.argv[1:]
    if os.environ.get("GPUBOX_SIM_SIDE") == "container" and argv[:1] == ["-c"] and argv[2:3] == [PROBE]:
        from ..transport import payload

        if argv[1] == payload.BOOT:
            _probe_or_pass_on(argv)
    real = next_python3()
    if real is None:
        sys.stderr.write("python3: command not found\n")
        sys.exit(127)
    os.execv(real, [real, *argv])


def _probe_or_pass_on(argv: list[str]) -> None:
    """The CUDA probe's payload: answered from the simulated state when it holds exactly the
    probe's source; else given back, unread, to the real python3 (the caller execs it)."""
    from ..provision import cuda_probe
    from .cuda import shipped, simulated_probe

    stream = sys.stdin.buffer.read()
    src = shipped(stream, PROBE)
    if src == Path(cuda_probe.__file__).read_bytes():
        sys.exit(simulated_probe(src.decode(), argv[4:]))
    spool = tempfile.TemporaryFile()  # the payload, given back to the real python3 as its stdin
    spool.write(stream)
    spool.seek(0)
    os.dup2(spool.fileno(), 0)


def next_python3() -> str | None:
    """The python3 that comes after this stand-in's folder on PATH (what ran before it existed).

    Where that is a launcher script (pyenv's shim: a chain of bash processes, 50 ms a call), the
    interpreter it starts, asked once and remembered beside the stand-in: a container's python3
    is the interpreter itself."""
    here = Path(sys.argv[0]).resolve().parent
    rest = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != here]
    found = shutil.which("python3", path=os.pathsep.join(rest))
    if found is None or not _is_script(found):
        return found
    return _resolved(here, found) or found


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def _resolved(here: Path, launcher: str) -> str | None:
    memo = here / ".python3-launchers.json"
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    key = f"{launcher}:{os.stat(launcher).st_mtime_ns}:{os.environ.get('PYENV_VERSION', '')}"
    if isinstance(known.get(key), str) and os.access(known[key], os.X_OK):
        return known[key]
    try:
        r = subprocess.run(
            [launcher, "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    exe = r.stdout.strip()
    if r.returncode != 0 or not exe or not os.access(exe, os.X_OK):
        return None
    known[key] = exe
    tmp = memo.with_name(f"{memo.name}.{os.getpid()}")
    try:  # remembered for the next call; a folder that cannot hold it only costs the next call
        tmp.write_text(json.dumps(known))
        os.replace(tmp, memo)
    except OSError:
        pass
    return exe
