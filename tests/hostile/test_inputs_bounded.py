"""Oracle: every file a command reads that someone else could write, replaced by a FIFO and by
/dev/zero (a symlink to it), gives one line and exit 2 within the timeout: never a hang (a FIFO
blocks open(2) and read(2) for ever) and never MemoryError (/dev/zero never ends).

Each case runs the installed CLI in a subprocess with a timeout, so a hang fails the test instead
of the suite. The set of reads: the inventory file, group_vars/ and host_vars/ beside it, result
documents (advise, report), `advise --probe`, `nccl check`, `gpus --input`, `probe --input`, the
history store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parent.parent / "fixtures"
RESULT = FIX / "results" / "seed-after.json"
INVENTORY = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve1: {ansible_connection: local}
    gpu_containers:
      hosts:
        ct1: {gpubox_vmid: 200, gpubox_proxmox_host: pve1}
"""


def _plant(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


def _inv(tmp: Path) -> Path:
    inv = tmp / "inv" / "hosts.yml"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(INVENTORY)
    return inv


# name -> (where the planted file goes, argv given tmp and the planted path)
CASES = {
    "inventory": (lambda t: t / "inv.yml", lambda t, p: ["-i", p, "inventory", "list"]),
    "group_vars": (
        lambda t: t / "inv" / "group_vars" / "all.yml",
        lambda t, p: ["-i", _inv(t), "inventory", "list"],
    ),
    "group_vars_noext": (
        lambda t: t / "inv" / "group_vars" / "gpu_containers",
        lambda t, p: ["-i", _inv(t), "inventory", "list"],
    ),
    "host_vars": (
        lambda t: t / "inv" / "host_vars" / "ct1.yml",
        lambda t, p: ["-i", _inv(t), "inventory", "list"],
    ),
    "advise_result": (lambda t: t / "r.json", lambda t, p: ["advise", p]),
    "advise_probe": (lambda t: t / "probe.json", lambda t, p: ["advise", RESULT, "--probe", p]),
    "report_result": (lambda t: t / "r.json", lambda t, p: ["report", p, "--format", "md", "-o", t / "rep"]),
    "nccl_check": (lambda t: t / "nccl.env", lambda t, p: ["nccl", "check", p]),
    "gpus_input": (lambda t: t / "topo.json", lambda t, p: ["gpus", "--input", p]),
    "probe_input": (lambda t: t / "probe.json", lambda t, p: ["probe", "--input", p]),
}


@pytest.mark.parametrize("kind", ["fifo", "zero"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_planted_fifo_or_dev_zero_is_one_line(tmp_path, case, kind):
    where, argv = CASES[case]
    planted = where(tmp_path)
    args = [str(a) for a in argv(tmp_path, planted)]
    _plant(planted, kind)
    env = dict(os.environ, GPUBOX_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(Path.cwd()))
    env.pop("GPUBOX_INVENTORY", None)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpubox.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"DAMAGE: `gpubox {' '.join(args)}` hung on a planted {kind}")
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 2, (p.returncode, p.stderr[-500:])
    assert len(lines) == 1 and "internal error" not in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert "MemoryError" not in p.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_history_store_planted(tmp_path, kind):
    """The box's history store (written by gpubox, in a directory another user may share)."""
    from gpubox.bench import history

    state = tmp_path / "state"
    state.mkdir()  # the store is made beneath an existing state directory, never through a link
    store = history.store_path("ct1", base=state)
    _plant(store, kind)
    env = dict(os.environ, GPUBOX_STATE_DIR=str(state), PYTHONPATH=str(Path.cwd()))
    inv = _inv(tmp_path)
    try:
        p = subprocess.run(
            [sys.executable, "-m", "gpubox.cli", "-i", str(inv), "history", "ct1"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"DAMAGE: `gpubox history` hung on a planted {kind} store")
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "internal error" not in lines[0], p.stderr


def test_readlimit_refuses_without_blocking(tmp_path):
    """The bounded reader itself: FIFO and devices by kind, a file over the bound by size."""
    from gpubox.readlimit import NotRegular, read_regular

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(NotRegular, match="FIFO"):
        read_regular(fifo, 100)
    with pytest.raises(NotRegular, match="character device"):
        read_regular("/dev/zero", 100)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(NotRegular, match="101 bytes"):
        read_regular(big, 100)
    assert read_regular(big, 101) == b"x" * 101


@pytest.mark.skipif(not shutil.which("mkfifo"), reason="needs mkfifo")
def test_local_transport_read_refuses_a_fifo(tmp_path):
    from gpubox.readlimit import NotRegular
    from gpubox.transport.local import LocalTransport

    os.mkfifo(tmp_path / "rec")
    with pytest.raises(NotRegular):
        LocalTransport().read_bytes(str(tmp_path / "rec"))
