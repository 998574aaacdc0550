#!/usr/bin/env python3
"""gpubox's own overhead on an already-healthy box: `gpubox recover BOX --no-bench` (every check,
nothing to stage, nothing to repair), as a whole CLI process, locally and over real SSH.

Goal (issue 8): under 2 s locally and under 5 s over SSH. Printed next to the same work done the
way a sysadmin would check it by hand (`lspci -vvv` on the GPUs' sysfs + cat of each file gpubox
reads), to show where the time goes.

    python3 benchmarks/recover_overhead.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(argv, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from gpubox.simbox import build
    from tests.sshd import start_sshd

    work = Path(tempfile.mkdtemp(prefix="gpubox-overhead-"))
    sim = build(work / "box", [])
    gpubox = [sys.executable, "-m", "gpubox.cli"]
    local_inv = str(sim.inventory_path)

    srv = start_sshd(work / "sshd")
    try:
        inv = yaml.safe_load(sim.inventory_path.read_text())
        for group in ("proxmox_hosts", "gpu_containers"):
            for hv in inv["all"]["children"][group]["hosts"].values():
                hv.pop("ansible_connection")
                hv.update(srv.vars())
        ssh_inv = work / "ssh-inventory.yml"
        ssh_inv.write_text(yaml.safe_dump(inv))

        sysfs = str(sim.hpath("/sys/bus/pci"))
        by_hand = ["lspci", "-vvv", "-A", "linux-sysfs", "-O", f"sysfs.path={sysfs}", "-d", "10de:"]
        rows = []
        for label, argv, goal in (
            (
                "gpubox recover --no-bench (local)",
                gpubox + ["-i", local_inv, "recover", "ct200", "--no-bench", "--json"],
                2.0,
            ),
            (
                "gpubox recover --no-bench (SSH)",
                gpubox + ["-i", str(ssh_inv), "recover", "ct200", "--no-bench", "--json"],
                5.0,
            ),
            ("gpubox doctor (local)", gpubox + ["-i", local_inv, "doctor", "ct200", "--json"], None),
            ("python3 -c pass (interpreter start)", [sys.executable, "-c", "pass"], None),
            ("lspci -vvv of the GPUs (by hand)", by_hand, None),
        ):
            timed(argv)  # warm the page cache and the SSH server
            xs = [timed(argv) for _ in range(args.runs)]
            rows.append((label, statistics.median(xs), min(xs), max(xs), goal))
    finally:
        srv.stop()

    print(f"{'what':42} {'median s':>9} {'min':>6} {'max':>6}  goal")
    ok = True
    for label, med, lo, hi, goal in rows:
        verdict = ""
        if goal is not None:
            verdict = f"< {goal:g} s  {'PASS' if med < goal else 'FAIL'}"
            ok &= med < goal
        print(f"{label:42} {med:9.2f} {lo:6.2f} {hi:6.2f}  {verdict}")
    print(f"({args.runs} runs each after one warm-up; simulated healthy box in {work})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
