"""The simulated box's inference server: gpubox's SIMULATOR (simbox.simserver) started through the
benchmark's `custom` launcher path, with expectations that match the simulator.

The simulator paces tokens in real time at `sim_speed` x the seed's rates (docs/facts.md "Reference
figures"), so the expectations below are the seed's figures x sim_speed, and result documents say
"simulated": true, "sim_speed": k.

It is also told where the simulated host and container roots are (`--host-root`, `--root`), so
that at start it reads the tuning gpubox manages - the GPUs' MaxReadReq in the host's sysfs config
space, kernel.numa_balancing, NCCL's variables (its environment over the container's NCCL config
files) - and decodes as much slower as the untuned seed box did (docs/bench.md, "tuning state").
The expectations stay those of the tuned box: an untuned box measures below them.
"""

from __future__ import annotations

import socket

from .core import SimBox

FAULTS = {
    "server_fail": "the inference server fails to start (CUDA init error in its log)",
}

SIM_SPEED = 20
SEED_TOK_S = {
    "tp1": {"auto": 26.6, "ddtree:15": 173.4},
    "tp4": {"auto": 37.8, "ddtree:15": 281.1},
    "tp8": {"auto": 37.6, "ddtree:15": 263.9},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _literal(path) -> str:
    """A path as a literal argv element of the launcher's template (which str.format()s each one)."""
    return str(path).replace("{", "{{").replace("}", "}}")


def build(sim: SimBox, faults: set[str]) -> None:
    ct = sim.inventory_extra["container"]
    cmd = [
        "{python}",
        "-m",
        f"{__package__}.simserver",  # run with `python -m`, not imported here
        "--model",
        "{model}",
        "--drafter",
        "{drafter}",
        "--method",
        "{method}",
        "--budget",
        "{budget}",
        "--tp",
        "{tp}",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--max-model-len",
        "{max_model_len}",
        "--speed",
        str(SIM_SPEED),
        "--host-root",
        _literal(sim.host_root),
        "--root",
        _literal(sim.ct_root),
        # per request: when it meant to send the first/last token and when it did, so a test can
        # tell "this machine fell behind the simulator's pace" from a wrong verdict
        "--truth-file",
        _literal(sim.truth_path),
    ]
    if "server_fail" in faults:
        cmd.append("--fail-start")
    bench = {
        "engine": "custom",
        "command": cmd,
        "simulated": True,
        "sim_speed": SIM_SPEED,
        "port": _free_port(),
        "profile": "health",
        "tp": [t for t in (1, 4, 8) if t <= sim.gpus] or [1],
        "methods": ["auto", "ddtree:15"],
        "repetitions": 1,
        "warmup": 1,
        "max_model_len": 32768,
        "request_timeout": 10,
        "ready_timeout": 30,
        "expect": {
            "tolerance": 0.15,
            "min_speedup_over_auto": 3.0,
            "tok_s": {
                tp: {m: round(v * SIM_SPEED, 1) for m, v in per.items()} for tp, per in SEED_TOK_S.items()
            },
        },
    }
    if "gpubox_model" not in ct:
        bench["model"] = "/dev/shm/Qwen3.6-27B"
    if "gpubox_drafter" not in ct:
        bench["drafter"] = "/dev/shm/Qwen3.6-27B-DFlash"
    ct["gpubox_bench"] = bench
    ct.setdefault("gpubox_gpus", sim.gpus)
