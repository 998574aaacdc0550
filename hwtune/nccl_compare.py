"""Side-by-side NCCL all-reduce: the current environment vs the same plus an NCCL profile.

NCCL reads its variables once per process (ncclParam caches the first read), so each arm runs
in its own child process: hwtune/probe.py with `--no-copies --no-p2p`, driving each TP GPU set
through torch.cuda.nccl. The GPU sets are the ones serving would use: topology.gpus_for_tp(n) for
n = 2, 4, 8 up to the GPU count. Arms alternate (A B A B ...) over `rounds`, and the median busbw
of each arm is compared, so a slow first start or a warming GPU does not favour one side.

Safety (issue 12, device KINDS.md): on shared hosts NVLink multicast must stay off, because a
program using it can take the host's GPUs out of service. Every child therefore gets
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 set *after*
the profile is applied; the process environment wins over nccl.conf files (docs/facts.md "NCCL
environment"), so no file can turn it back on. A profile that tries to change them, or asks for
the NVLS algorithms, is refused. Each child reports the environment it saw; a child whose report
lacks the safety values is an error, not a figure.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from gpubox.errors import GpuboxError

PROBE = Path(__file__).with_name("probe.py")
SCHEMA = "gpubox.nccl-compare/1"

# NVLink multicast off in NCCL, PyTorch symmetric memory and NVSHMEM (device KINDS.md, issue 12).
SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
NVLS_ALGOS = ("nvls", "nvlstree")
# Decode-time TP all-reduces are small (hidden x batch x 2 bytes: ~10 KiB..MiBs); 256 MiB shows
# the links' bandwidth. Both, because a latency profile (LL) can win one and lose the other.
DEFAULT_SIZES = [1 << 20, 256 << 20]


def profile_conflicts(env: Mapping[str, str]) -> list[str]:
    """What in a profile would weaken the NVLink-multicast safety (empty: nothing)."""
    out = []
    for k, want in SAFETY_ENV.items():
        if k in env and str(env[k]).strip() != want:
            out.append(f"{k}={env[k]} (must stay {want})")
    algo = str(env.get("NCCL_ALGO", ""))
    for seg in algo.split(";"):
        body = seg.split(":", 1)[-1].strip()
        if body.startswith("^"):
            continue  # an exclusion list: '^NVLS' keeps NVLS out, fine
        toks = [t.strip().lower() for t in body.split(",")]
        if any(t in NVLS_ALGOS for t in toks):
            out.append(f"NCCL_ALGO={algo} (asks for NVLink multicast algorithms)")
            break
    return out


def child_env(
    base: Mapping[str, str], profile_env: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """(environment for one child, names whose value the safety forced). The profile is applied
    over `base`, then the safety values over both: whatever the inputs, the result has them."""
    env = dict(base)
    if profile_env:
        env.update({k: str(v) for k, v in profile_env.items()})
    forced = [k for k, v in SAFETY_ENV.items() if env.get(k) != v]
    env.update(SAFETY_ENV)
    return env, forced


def tp_sets(topo, sizes=(2, 4, 8)) -> list[dict[str, Any]]:
    """The GPU set gpus_for_tp picks for each TP size that fits (TP1 moves no bus traffic)."""
    from .topology import gpus_for_tp

    out = []
    for n in sizes:
        ch = gpus_for_tp(topo, n)
        if ch.fits and n > 1:
            out.append({"tp": n, "gpus": ch.gpus, "crosses_numa": ch.crosses_numa, "reason": ch.reason})
    return out


def probe_argv(python: str, sets: list[list[int]], sizes: list[int], quick: bool) -> list[str]:
    argv = [
        python,
        str(PROBE),
        "--no-copies",
        "--no-p2p",
        "--allreduce-sets",
        ";".join(",".join(map(str, s)) for s in sets),
        "--allreduce-bytes",
        ",".join(map(str, sizes)),
    ]
    return argv + (["--quick"] if quick else [])


def run_child(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One arm: the probe's JSON document, or {"error": ...} when it did not produce one."""
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s"}
    except OSError as exc:
        return {"error": f"cannot start {argv[0]}: {exc.strerror}"}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    try:
        doc = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"rc {r.returncode}, no probe JSON: {tail[:300]}"}
    doc["wall_s"] = round(time.monotonic() - t0, 2)
    doc["stderr_tail"] = r.stderr[-2000:]
    return doc


def verify_child_env(doc: Mapping[str, Any]) -> list[str]:
    """Safety values the child did NOT see (the child's own record, not what we passed)."""
    seen = doc.get("env") or {}
    return [f"{k}={seen.get(k)!r}" for k, v in SAFETY_ENV.items() if seen.get(k) != v]


def _allreduces(doc: Mapping[str, Any]) -> dict[tuple[tuple[int, ...], int], dict]:
    probes = ((doc.get("bandwidth") or {}).get("probes")) or []
    return {
        (tuple(p.get("gpus") or ()), int(p.get("bytes") or 0)): p
        for p in probes
        if p.get("name") == "allreduce"
    }


def compare_rows(sets: list[dict], sizes: list[int], arms: dict[str, list[dict]]) -> list[dict[str, Any]]:
    """One row per (TP set, size): median busbw of each arm over its rounds, and profile/baseline."""
    rows = []
    for s in sets:
        for size in sizes:
            key = (tuple(s["gpus"]), size)
            row: dict[str, Any] = {"tp": s["tp"], "gpus": s["gpus"], "bytes": size}
            for arm, docs in arms.items():
                vals, why = [], None
                for d in docs:
                    p = _allreduces(d).get(key)
                    if p and p.get("status") == "ok" and p.get("busbw_gbps") is not None:
                        vals.append(float(p["busbw_gbps"]))
                    elif p:
                        why = why or p.get("reason") or p.get("status")
                    else:
                        why = (
                            why
                            or d.get("error")
                            or ((d.get("bandwidth") or {}).get("reason"))
                            or "not measured"
                        )
                row[arm] = round(statistics.median(vals), 2) if vals else None
                row[f"{arm}_runs"] = vals
                if not vals:
                    row[f"{arm}_reason"] = why
            b, p = row.get("baseline"), row.get("profile")
            row["ratio"] = round(p / b, 3) if b and p is not None else None
            rows.append(row)
    return rows


def run(
    profile,
    sets: list[dict],
    *,
    sizes: list[int] | None = None,
    rounds: int = 1,
    quick: bool = False,
    python: str = sys.executable,
    base_env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
    allow_conflicts: bool = False,
    aa: bool = False,
) -> dict[str, Any]:
    """Measure both arms (and an A/A arm with `aa`) and compare. `profile` is an hwtune.nccl.Profile."""
    sizes = list(sizes or DEFAULT_SIZES)
    if rounds < 1:
        raise GpuboxError(f"rounds = {rounds} is not a positive number", "use 1 or more")
    conflicts = profile_conflicts(profile.env)
    if conflicts and not allow_conflicts:
        raise GpuboxError(
            f"profile {profile.name} would turn NVLink multicast back on: {'; '.join(conflicts)}",
            "remove those entries from the profile: the comparison keeps NVLS off in every process",
        )
    base = dict(os.environ if base_env is None else base_env)
    notes = [f"safety kept in every child: {' '.join(f'{k}={v}' for k, v in SAFETY_ENV.items())}"]
    if conflicts:
        notes.append("profile entries overridden by the safety: " + "; ".join(conflicts))
    already = [k for k, v in profile.env.items() if base.get(k) == str(v)]
    if already and len(already) == len(profile.env):
        notes.append("the current environment already has every profile value: both arms are the same")
    envs = {"baseline": child_env(base), "profile": child_env(base, profile.env)}
    if aa:
        envs["baseline_aa"] = child_env(base)  # A/A: same environment again, the noise floor
    t0 = time.monotonic()
    if not sets:
        notes.append("no TP set of 2 or more GPUs fits on this machine: nothing to compare")
        arms: dict[str, list[dict]] = {a: [] for a in envs}
    else:
        arms = run_arms(
            {a: e[0] for a, e in envs.items()},
            probe_argv(python, [s["gpus"] for s in sets], sizes, quick),
            rounds,
            timeout,
        )
    rows = compare_rows(sets, sizes, arms)
    first = next((d for docs in arms.values() for d in docs if "error" not in d), {})
    return {
        "schema": SCHEMA,
        "profile": profile.name,
        "profile_env": dict(profile.env),
        "safety_env": dict(SAFETY_ENV),
        "sets": sets,
        "sizes": sizes,
        "rounds": rounds,
        "quick": quick,
        "rows": rows,
        "notes": notes,
        "forced": {arm: e[1] for arm, e in envs.items()},
        "child_env": {arm: [d.get("env") for d in docs] for arm, docs in arms.items()},
        "errors": [f"{arm}: {d['error']}" for arm, docs in arms.items() for d in docs if "error" in d],
        "torch": first.get("torch"),
        "gpu_bus_ids": (first.get("bandwidth") or {}).get("gpu_bus_ids"),
        "seconds": round(time.monotonic() - t0, 2),
    }


def run_arms(
    envs: dict[str, dict[str, str]], argv: list[str], rounds: int, timeout: float, child=None
) -> dict[str, list[dict]]:
    """Each arm once per round, in an order rotated every round (A B C, B C A, ...) so no arm always
    runs first or right after the same neighbour. Every child's own record of its environment is
    checked for the NVLink-multicast safety; one without it is an error, not a figure."""
    child = child or run_child
    names = list(envs)
    arms: dict[str, list[dict]] = {a: [] for a in names}
    for r in range(rounds):
        k = r % len(names)
        for arm in names[k:] + names[:k]:
            env = dict(envs[arm])
            env.update(SAFETY_ENV)
            doc = child(argv, env, timeout)
            if "error" not in doc:
                missing = verify_child_env(doc)
                if missing:
                    doc = {"error": f"child ran without the NVLS safety: {', '.join(missing)}"}
            arms[arm].append(doc)
    return arms


def exit_code(result: Mapping[str, Any]) -> int:
    """0: every row measured in both arms; 1: some row not measured (errors, skipped)."""
    rows = result.get("rows") or []
    if result.get("errors"):
        return 1
    return (
        0 if rows and all(r.get("baseline") is not None and r.get("profile") is not None for r in rows) else 1
    )


def human_size(n: int) -> str:
    for unit, sh in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << sh and n % (1 << sh) == 0:
            return f"{n >> sh} {unit}"
    return f"{n} B"


def render(result: Mapping[str, Any], con) -> None:
    """The comparison as a table (rich console)."""
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"NCCL all-reduce busbw: current environment vs + profile {escape(result['profile'])}")
    aa = any(r.get("baseline_aa") is not None for r in result["rows"])
    for col in ("TP", "GPUs", "size", "baseline GB/s", "profile GB/s", "profile / baseline") + (
        ("A/A GB/s",) if aa else ()
    ):
        t.add_column(col, justify="right" if "GB/s" in col or "/" in col else "left")
    for r in result["rows"]:
        ratio = r.get("ratio")
        style = "" if ratio is None else ("green" if ratio >= 1.02 else "red" if ratio <= 0.98 else "")
        shown = "-" if ratio is None else f"[{style}]{ratio:.3f}[/]" if style else f"{ratio:.3f}"
        t.add_row(
            str(r["tp"]),
            ",".join(map(str, r["gpus"])),
            human_size(r["bytes"]),
            "-" if r.get("baseline") is None else f"{r['baseline']:.2f}",
            "-" if r.get("profile") is None else f"{r['profile']:.2f}",
            shown,
            *((("-" if r.get("baseline_aa") is None else f"{r['baseline_aa']:.2f}"),) if aa else ()),
        )
    con.print(t)
    for r in result["rows"]:
        for arm in ("baseline", "profile"):
            if r.get(f"{arm}_reason"):
                con.print(
                    f"[yellow]TP{r['tp']} {human_size(r['bytes'])} {arm}: {escape(str(r[f'{arm}_reason']))}[/]"
                )
                break
    for e in result.get("errors") or []:
        con.print(f"[red]{escape(e)}[/]")
    for n in result.get("notes") or []:
        con.print(f"[dim]{escape(n)}[/]")


def parse_gpu_sets(text: str | None) -> list[list[int]] | None:
    """`--allreduce-sets` ('0,1,2,3;4,5,6,7') as GPU index sets; None when not given. Bad text is
    bad input (probe and tune ablate take the option)."""
    if text is None:
        return None
    from . import probe

    try:
        sets = probe.parse_sets(text)
    except ValueError:
        sets = None
    if sets is None or any(not s or min(s) < 0 for s in sets):
        raise GpuboxError(
            f"--allreduce-sets {text!r} is not a list of GPU index sets", "e.g. '0,1,2,3;4,5,6,7'"
        )
    return sets
