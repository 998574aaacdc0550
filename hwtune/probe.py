#!/usr/bin/env python3
"""GPU health probe: NVML facts and copy-bandwidth measurements, printed as one JSON document.

Runs standalone on the target: gpubox runs this module as a payload (gpubox.transport.payload) with
`python3 [options]` in the container
(the server's venv has torch; gpubox need not be installed there), so it imports only the standard
library plus pynvml (nvidia-ml-py) and torch when they are importable. It measures and reports;
judging the figures against limits is gpubox's job (hwtune/probe_verdict.py), so the verdict code
is tested in CI on output recorded from a real GPU.

This module is the entry (options, the document's top level); the facts and figures come from
probe_nvml.py and probe_topology.py (NVML), probe_bandwidth.py (torch) and probe_common.py. As a
payload every one of them travels; run by path, they are found next to this file.

Every section is independent and ends as {"status": "ok" | "skipped" | "failed", "reason": ...}:
no NVML, no GPU or no torch makes a section "skipped" with the missing piece named, never a crash.
The probe is read-only: it changes no clock, MIG, persistence or PCIe setting.

    python3 hwtune/probe.py [--quick] [--no-bandwidth] [--no-p2p] [--p2p-pairs 0-1,0-4]
                            [--allreduce-sets "0,1,2,3;4,5,6,7"] [--no-copies]
                            [--allreduce-bytes 1048576,268435456]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

if __package__:
    from .probe_bandwidth import bandwidth_section, default_sets, torch_section
    from .probe_common import SCHEMA, error_text
    from .probe_nvml import XidWatch, nvml_section
else:  # run by path (python3 hwtune/probe.py, -I too): the sibling modules sit next to this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from probe_bandwidth import bandwidth_section, default_sets, torch_section
    from probe_common import SCHEMA, error_text
    from probe_nvml import XidWatch, nvml_section

# default_sets is what the probe runs when no sets are given: benchmarks/multigpu_run.sh reads it here
__all__ = ["collect", "default_sets", "main", "parse_bytes", "parse_pairs", "parse_sets"]


def parse_pairs(text: str | None):
    """'0-1,0-4' -> [(0, 1), (0, 4)]; None -> None (every ordered pair)."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        if part.strip():
            a, _, b = part.strip().partition("-")
            out.append((int(a), int(b)))
    return out


def parse_sets(text: str | None):
    """'0,1,2,3;4,5,6,7' -> [[0,1,2,3],[4,5,6,7]]; '' -> []; None -> None (default sets)."""
    if text is None:
        return None
    sets = []
    for part in text.split(";"):
        part = part.strip()
        if part:
            sets.append([int(x) for x in part.split(",") if x.strip()])
    return sets


# Environment that shapes NCCL/collectives, recorded so a run shows what it ran under (and the
# NCCL profile comparison can prove its children kept NVLink multicast off).
ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "TORCH_NCCL_")


def parse_bytes(text: str | None):
    """'1048576,256M,1G' -> [1048576, 268435456, 1073741824]; None -> None (the default size)."""
    if text is None:
        return None
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    out = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("IB").removesuffix("B")
        if part:
            out.append(int(part[:-1]) * mult[part[-1]] if part[-1] in mult else int(part))
    return out


def collect(
    *,
    quick: bool = False,
    bandwidth: bool = True,
    p2p: bool = True,
    allreduce_sets=None,
    p2p_pairs=None,
    copies: bool = True,
    allreduce_bytes=None,
) -> dict:
    t0 = time.monotonic()
    doc = {
        "schema": SCHEMA,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    try:
        nvml, nv, handles = nvml_section()
    except Exception as exc:
        nvml, nv, handles = {"status": "failed", "reason": error_text(exc)}, None, {}
    doc["nvml"] = nvml
    watch = XidWatch(nv, handles)
    if not bandwidth:
        doc["torch"] = {"status": "skipped", "reason": "bandwidth probes off (--no-bandwidth)"}
        doc["bandwidth"] = {"status": "skipped", "reason": "bandwidth probes off (--no-bandwidth)"}
    else:
        tsec, torch = torch_section()
        doc["torch"] = tsec
        if torch is None:
            doc["bandwidth"] = {"status": tsec["status"], "reason": tsec.get("reason")}
        else:
            try:
                doc["bandwidth"] = bandwidth_section(
                    torch,
                    nv,
                    handles,
                    quick=quick,
                    p2p=p2p,
                    allreduce_sets=allreduce_sets,
                    p2p_pairs=p2p_pairs,
                    copies=copies,
                    allreduce_bytes=allreduce_bytes,
                )
            except Exception as exc:
                doc["bandwidth"] = {"status": "failed", "reason": error_text(exc)}
    doc["xid"] = watch.finish()
    if nv is not None:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    doc["seconds"] = round(time.monotonic() - t0, 2)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="probe", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller buffers, fewer repetitions")
    ap.add_argument("--no-bandwidth", action="store_true", help="NVML facts only")
    ap.add_argument("--no-p2p", action="store_true", help="skip the GPU pair copies")
    ap.add_argument(
        "--allreduce-sets",
        default=None,
        metavar="SETS",
        help="GPU sets for the all-reduce, e.g. '0,1,2,3;4,5,6,7' ('' for none)",
    )
    ap.add_argument(
        "--p2p-pairs",
        default=None,
        metavar="PAIRS",
        help="GPU pairs to copy between, e.g. '0-1,0-4' (default: every ordered pair)",
    )
    ap.add_argument(
        "--no-copies", action="store_true", help="skip the per-GPU H2D/D2H/D2D copies (e.g. all-reduce only)"
    )
    ap.add_argument(
        "--allreduce-bytes",
        default=None,
        metavar="SIZES",
        help="all-reduce buffer sizes, e.g. '1M,256M' (default: one size, 256 MiB; quick 64 MiB)",
    )
    ap.add_argument("--indent", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        ar_bytes = parse_bytes(a.allreduce_bytes)
    except (ValueError, IndexError):
        ap.error(f"--allreduce-bytes {a.allreduce_bytes!r}: give sizes like 1048576 or 1M,256M")
    doc = collect(
        quick=a.quick,
        bandwidth=not a.no_bandwidth,
        p2p=not a.no_p2p,
        allreduce_sets=parse_sets(a.allreduce_sets),
        p2p_pairs=parse_pairs(a.p2p_pairs),
        copies=not a.no_copies,
        allreduce_bytes=ar_bytes,
    )
    sys.stdout.write(json.dumps(doc, indent=a.indent) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
