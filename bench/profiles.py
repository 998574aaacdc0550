"""Benchmark profiles: what a profile measures, with the inventory's and the command line's
overrides, and the order of its points. Kept apart from the workloads that measure them
(bench/workloads.py), so deciding a plan (doctor, recover's dry run, the playbooks) never loads the
HTTP client.

Profiles: `health` (TP1/4/8 x {auto, ddtree:15} x 1024 + C=8, a few minutes on the real box) and
`full` (adds linear and budgets 16/32/64, all output lengths, the sweep, long context, agentic).
Both can be overridden from the inventory: `gpubox_bench.profiles.<name>` (any key below), and the
top-level `tp`/`methods`/`repetitions`/`warmup` apply to the box's default profile.
"""

from __future__ import annotations

import copy
from typing import Any

from gpubox.errors import GpuboxError

PROFILES: dict[str, dict[str, Any]] = {
    "health": {
        "tp": [1, 4, 8],
        "methods": ["auto", "ddtree:15"],
        "warmup": 1,
        "repetitions": 3,
        "prompt_tokens": 128,
        "workloads": [
            {"kind": "decode", "output_lens": [1024]},
            {"kind": "concurrency", "concurrency": [8], "output_len": 1024},
        ],
    },
    "full": {
        "tp": [1, 4, 8],
        "methods": ["auto", "linear:15", "ddtree:15", "ddtree:16", "ddtree:32", "ddtree:64"],
        "warmup": 1,
        "repetitions": 3,
        "prompt_tokens": 128,
        "workloads": [
            {"kind": "decode", "output_lens": [256, 1024, 2048]},
            {"kind": "concurrency", "concurrency": [1, 2, 4, 8], "output_len": 1024},
            {"kind": "long_context", "context_tokens": [25000, 100000], "output_len": 256},
            {"kind": "agentic", "turns": 6, "prefix_tokens": 3000, "turn_tokens": 100, "output_len": 128},
        ],
    },
}
KINDS = ("decode", "concurrency", "long_context", "agentic")
WARMUP_TOKENS = 16  # warmup requests only need to exercise the path (graphs, caches), not to be long


def resolve_profile(name: str, bench_vars: dict[str, Any] | None = None) -> dict[str, Any]:
    """The profile with the inventory's overrides applied."""
    bench_vars = bench_vars or {}
    custom = bench_vars.get("profiles") or {}
    if name not in PROFILES and name not in custom:
        raise GpuboxError(
            f"unknown benchmark profile {name!r}",
            f"use one of {', '.join(sorted({*PROFILES, *custom}))} or define gpubox_bench.profiles.{name}",
        )
    prof = copy.deepcopy(PROFILES.get(name, PROFILES["health"]))
    prof.update(copy.deepcopy(custom.get(name) or {}))
    if name == bench_vars.get("profile", "health"):
        for k in ("tp", "methods", "repetitions", "warmup"):
            if k in bench_vars:
                prof[k] = copy.deepcopy(bench_vars[k])
    prof["name"] = name
    for w in prof["workloads"]:
        if w.get("kind") not in KINDS:
            raise GpuboxError(
                f"profile {name}: unknown workload kind {w.get('kind')!r}", f"use {', '.join(KINDS)}"
            )
    if int(prof.get("repetitions", 1)) < 1:
        raise GpuboxError(f"profile {name}: repetitions must be >= 1", "set repetitions: 3")
    return prof


def apply_overrides(
    prof: dict[str, Any],
    *,
    concurrency: list[int] | None = None,
    output_len: int | None = None,
    prompt_len: int | None = None,
) -> dict[str, Any]:
    """A profile with `bench run` flags applied: --concurrency replaces the sweep (added when the
    profile has none), --output-len every output length, --prompt-len the prompt size."""
    prof = copy.deepcopy(prof)
    for v, what in ((output_len, "--output-len"), (prompt_len, "--prompt-len")):
        if v is not None and v < 1:
            raise GpuboxError(f"{what} {v} must be >= 1", f"give a positive token count to {what}")
    if concurrency is not None and (not concurrency or min(concurrency) < 1):
        raise GpuboxError(f"--concurrency {concurrency} must be >= 1", "e.g. --concurrency 1,8,32")
    if prompt_len is not None:
        prof["prompt_tokens"] = prompt_len
    ws = prof["workloads"]
    if concurrency is not None:
        conc = [w for w in ws if w["kind"] == "concurrency"]
        if conc:
            for w in conc:
                w["concurrency"] = list(concurrency)
        else:
            ws.append({"kind": "concurrency", "concurrency": list(concurrency), "output_len": 1024})
    if output_len is not None:
        for w in ws:
            if w["kind"] == "decode":
                w["output_lens"] = [output_len]
            elif "output_len" in w or w["kind"] == "concurrency":
                w["output_len"] = output_len
    return prof


def plan(profile: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The workload points of a profile for one server, in run order: (kind, kwargs)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for w in profile["workloads"]:
        k = w["kind"]
        if k == "decode":
            out += [("decode", {"output_len": int(n)}) for n in w.get("output_lens", [1024])]
        elif k == "concurrency":
            out += [
                ("concurrency", {"conc": int(n), "output_len": int(w.get("output_len", 1024))})
                for n in w.get("concurrency", [8])
            ]
        elif k == "long_context":
            out += [
                ("long_context", {"ctx_tokens": int(n), "output_len": int(w.get("output_len", 256))})
                for n in w.get("context_tokens", [25000])
            ]
        elif k == "agentic":
            out.append(
                (
                    "agentic",
                    {
                        "turns": int(w.get("turns", 6)),
                        "prefix_tokens": int(w.get("prefix_tokens", 3000)),
                        "turn_tokens": int(w.get("turn_tokens", 100)),
                        "output_len": int(w.get("output_len", 128)),
                    },
                )
            )
    return out


def key_of(tp: int, label: str, kind: str, kw: dict[str, Any]) -> str:
    suffix = {
        "decode": lambda: f"out{kw['output_len']}",
        "concurrency": lambda: f"c{kw['conc']}",
        "long_context": lambda: f"ctx{kw['ctx_tokens']}",
        "agentic": lambda: f"turns{kw['turns']}",
    }[kind]()
    return f"tp{tp}/{label}/{kind}/{suffix}"
