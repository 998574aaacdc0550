#!/usr/bin/env python3
"""The playbooks at fleet scale, side by side with a plain Ansible play and the gpubox CLI.

For each N, builds N simulated boxes (each with the seed's reboot faults, each on its own simulated
Proxmox host, all reached with Ansible's local connection), installs gpubox once (one venv that
every host's gpubox_venv names), repairs them with recover.yml, then times in one run:

  - recover.yml, second run (nothing to do), and doctor.yml;
  - a plain Ansible play of three tasks (ping, stat, command) on the same N hosts;
  - the gpubox CLI in a loop (`gpubox recover BOX --no-bench --json`), one box after another
    and 8 at a time;

and prints wall time in total and per box, and the PLAY RECAP's changed count. Settings in force are
printed with the table (forks, strategy, fact gathering and caching, pipelining).

    python3 benchmarks/ansible_fleet.py                  # N = 1, 8, 32
    python3 benchmarks/ansible_fleet.py --sizes 16 --forks 8 --repeat 2
    python3 benchmarks/ansible_fleet.py --checkout /path/to/other/checkout   # its playbooks and gpubox

Runs from a checkout with gpubox importable (README's .venv: .venv/bin/python benchmarks/...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"{name} not found (run with the python of the venv that has ansible-core)")
    return found


def make_venv(venv: Path) -> None:
    """The venv every simulated host's gpubox_venv names: made from this interpreter, seeing its
    packages (the install role then puts the wheel in it, without dependencies)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    if sys.prefix != sys.base_prefix:
        import site

        ours = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
        (pure,) = {Path(p) for p in venv.glob("lib/python*/site-packages")}
        (pure / "zz-gpubox-bench-deps.pth").write_text("".join(f"{p}\n" for p in ours))


def build_fleet(base: Path, n: int, venv: Path) -> Path:
    from gpubox.simbox import build

    inv: dict = {"all": {"children": {"proxmox_hosts": {"hosts": {}}, "gpu_containers": {"hosts": {}}}}}
    install = {
        "gpubox_home": f"{venv}-home",
        "gpubox_venv": str(venv),
        "gpubox_venv_python": sys.executable,
        "gpubox_venv_system_site_packages": True,
        "gpubox_wheel_deps": False,
    }
    for i in range(n):
        box, host = f"ct{i:03d}", f"pve{i:03d}"
        sim = build(base / box, ["seed"], vmid=200 + i, box=box, host=host)
        si = yaml.safe_load(sim.inventory_path.read_text())["all"]["children"]
        hv = dict(si["proxmox_hosts"]["hosts"][host])
        hv.update(
            install, ansible_python_interpreter=sys.executable, gpubox_state_dir=str(base / f"state-{host}")
        )
        inv["all"]["children"]["proxmox_hosts"]["hosts"][host] = hv
        inv["all"]["children"]["gpu_containers"]["hosts"][box] = {
            **si["gpu_containers"]["hosts"][box],
            **install,
            "ansible_python_interpreter": sys.executable,
            "gpubox_state_dir": str(base / f"state-{box}"),
        }
    path = base / "inventory.yml"
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


PLAIN = [
    {
        "name": "Plain play of three tasks",
        "hosts": "gpu_containers",
        "gather_facts": False,
        "tasks": [
            {"name": "Ping the host", "ansible.builtin.ping": {}, "delegate_to": "{{ gpubox_proxmox_host }}"},
            {
                "name": "Stat a file",
                "ansible.builtin.stat": {
                    "path": "{{ hostvars[gpubox_proxmox_host].gpubox_root }}/proc/devices"
                },
                "delegate_to": "{{ gpubox_proxmox_host }}",
            },
            {
                "name": "Run a command",
                "ansible.builtin.command": {
                    "argv": ["cat", "{{ hostvars[gpubox_proxmox_host].gpubox_root }}/proc/devices"]
                },
                "delegate_to": "{{ gpubox_proxmox_host }}",
                "changed_when": False,
            },
        ],
    }
]


class Runner:
    def __init__(self, checkout: Path, base: Path, inv: Path, forks: int):
        self.checkout, self.base, self.inv, self.forks = checkout, base, inv, forks
        self.env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(checkout / "playbooks" / "ansible.cfg"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_LOCAL_TEMP=str(base / ".ansible-tmp"),
            ANSIBLE_FORKS=str(forks),
        )
        self.env.pop("PYTHONPATH", None)  # the modules import gpubox from the venv the play installed
        self.cli_env = dict(self.env, PYTHONPATH=str(checkout))
        self.extra = json.dumps(
            {
                "gpubox_results_dir": str(base / "results"),
                "gpubox_source": str(checkout),
                "gpubox_wheel_dir": str(base / "wheels"),
                "gpubox_bench_enabled": False,
            }
        )

    def play(self, book: str | Path, *args: str, ok_rc=(0,)) -> tuple[float, int, dict]:
        path = book if isinstance(book, Path) else self.checkout / "playbooks" / book
        argv = [
            tool("ansible-playbook"),
            "-i",
            str(self.inv),
            str(path),
            "-e",
            self.extra,
            "-f",
            str(self.forks),
            *args,
        ]
        t0 = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=self.base)
        dt = time.perf_counter() - t0
        if p.returncode not in ok_rc:
            raise SystemExit(
                f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-4000:]}\n{p.stderr[-2000:]}"
            )
        recap = {m.group(1): int(m.group(3)) for m in RECAP.finditer(p.stdout)}
        return dt, p.returncode, recap

    def cli(self, box: str) -> None:
        argv = [sys.executable, "-m", "gpubox", "-i", str(self.inv), "recover", box, "--no-bench", "--json"]
        p = subprocess.run(argv, capture_output=True, text=True, env=self.cli_env, cwd=self.base)
        if p.returncode != 0:
            raise SystemExit(
                f"{' '.join(argv)} exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
            )

    def cli_loop(self, boxes: list[str], parallel: int) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(self.cli, boxes))
        return time.perf_counter() - t0


def measure(checkout: Path, n: int, forks: int, repeat: int, keep: bool) -> list[tuple[str, float, int]]:
    base = Path(tempfile.mkdtemp(prefix=f"gpubox-fleet-{n}-"))
    try:
        venv = base / "venv"
        make_venv(venv)
        inv = build_fleet(base, n, venv)
        r = Runner(checkout, base, inv, forks)
        boxes = [f"ct{i:03d}" for i in range(n)]
        r.play("install.yml", "-l", "pve000")  # one venv for every host: installed once
        first, _, _ = r.play("recover.yml")
        rows = [("recover.yml, first run (repairs)", first, -1)]
        plain = base / "plain.yml"
        plain.write_text(yaml.safe_dump(PLAIN, sort_keys=False))
        best: dict[str, tuple[float, int]] = {}

        def keep_best(label: str, dt: float, changed: int) -> None:
            if label not in best or dt < best[label][0]:
                best[label] = (dt, changed)

        for _ in range(repeat):
            dt, _, rc = r.play("recover.yml")
            keep_best("recover.yml, second run (nothing to do)", dt, sum(rc.values()))
            dt, _, rc = r.play("doctor.yml")
            keep_best("doctor.yml", dt, sum(rc.values()))
            dt, _, rc = r.play("recover.yml", "--check")
            keep_best("recover.yml --check", dt, sum(rc.values()))
            dt, _, rc = r.play(plain)
            keep_best("plain play, 3 tasks", dt, sum(rc.values()))
            keep_best("CLI loop, one at a time", r.cli_loop(boxes, 1), -1)
            keep_best("CLI loop, 8 in parallel", r.cli_loop(boxes, 8), -1)
        rows += [(k, v[0], v[1]) for k, v in best.items()]
        return rows
    finally:
        if keep:
            print(f"(kept {base})", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,8,32", help="fleet sizes N, comma-separated (default 1,8,32)")
    ap.add_argument("--forks", type=int, default=8, help="ansible-playbook -f (default 8)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measured line; the fastest is shown")
    ap.add_argument("--checkout", type=Path, default=ROOT, help="whose playbooks and gpubox to run")
    ap.add_argument("--keep", action="store_true", help="keep the simulated fleets")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    checkout = args.checkout.resolve()
    print(
        f"checkout {checkout}; {os.cpu_count()} CPUs; ansible-playbook -f {args.forks}, strategy linear, "
        "gather_facts: false (no facts gathered, so fact caching plays no part), local connection "
        "(pipelining and ControlPersist do not apply); best of "
        f"{args.repeat} run(s)"
    )
    table: dict[int, list[tuple[str, float, int]]] = {}
    for n in sizes:
        table[n] = measure(checkout, n, args.forks, args.repeat, args.keep)
        print(f"\nN = {n}")
        print(f"  {'what':42} {'total s':>8} {'per box s':>10} {'changed':>8}")
        for label, dt, changed in table[n]:
            ch = "" if changed < 0 else str(changed)
            print(f"  {label:42} {dt:8.1f} {dt / n:10.2f} {ch:>8}")
    if len(sizes) > 1:
        print("\nper box, s:")
        labels = [label for label, _, _ in table[sizes[0]]]
        print(f"  {'what':42} " + " ".join(f"{'N=' + str(n):>8}" for n in sizes))
        for label in labels:
            vals = {lb: dt for lb, dt, _ in [(a, b, c) for a, b, c in sum(table.values(), [])] if lb == label}
            cells = []
            for n in sizes:
                d = {lb: dt for lb, dt, _ in table[n]}
                cells.append(f"{d[label] / n:8.2f}")
            del vals
            print(f"  {label:42} " + " ".join(cells))


if __name__ == "__main__":
    main()
