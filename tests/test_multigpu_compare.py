"""The NCCL profile comparison (`gpubox probe --local --nccl-compare`): TP sets from the topology,
medians and ratios over alternating arms, the table, exit codes, and a real end-to-end run of
both child processes on a machine without GPUs (every row then says why it was not measured)."""

import copy
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gpubox.hwtune import nccl_compare
from gpubox.hwtune.topology import from_file
from tests.clirun import gpubox

ROOT = Path(__file__).resolve().parents[1]
PFIX = ROOT / "tests" / "fixtures" / "probe"
TFIX = ROOT / "tests" / "fixtures" / "topology"


def child_doc(scale: float, sizes=(268435456,)) -> dict:
    """A child's probe document built from the synthetic 4-GPU one, busbw scaled, one entry per size."""
    doc = json.loads((PFIX / "synthetic_4gpu_h200_nvlink.json").read_text())
    ars = []
    for p in doc["bandwidth"]["probes"]:
        if p["name"] == "allreduce":
            for nb in sizes:
                q = copy.deepcopy(p)
                q.update(
                    bytes=nb, busbw_gbps=round(p["busbw_gbps"] * scale * (0.1 if nb < 1 << 24 else 1), 2)
                )
                ars.append(q)
    doc["bandwidth"]["probes"] = ars
    return doc


SETS = [{"tp": 2, "gpus": [0, 1]}, {"tp": 4, "gpus": [0, 1, 2, 3]}]


def test_tp_sets_follow_gpus_for_tp():
    pcie = nccl_compare.tp_sets(from_file(str(TFIX / "synthetic_8gpu_2numa_pcie.json")))
    assert [(s["tp"], s["gpus"], s["crosses_numa"]) for s in pcie] == [
        (2, [0, 1], False),
        (4, [0, 1, 2, 3], False),
        (8, list(range(8)), True),
    ]
    hgx = nccl_compare.tp_sets(from_file(str(TFIX / "synthetic_8gpu_h200_hgx.json")), sizes=(1, 2, 4, 8, 16))
    assert [s["tp"] for s in hgx] == [2, 4, 8]  # TP1 moves no bus traffic; TP16 does not fit


def test_rows_median_over_rounds_and_ratio():
    arms = {
        "baseline": [child_doc(1.0), child_doc(0.9), child_doc(1.1)],
        "profile": [child_doc(0.5), child_doc(0.52), child_doc(0.48)],
    }
    rows = nccl_compare.compare_rows(SETS, [268435456], arms)
    assert [(r["tp"], r["baseline"], r["profile"]) for r in rows] == [(2, 338.5, 169.25), (4, 352.7, 176.35)]
    assert rows[0]["ratio"] == 0.5 and len(rows[0]["baseline_runs"]) == 3
    assert rows[0]["baseline_runs"] == [338.5, 304.65, 372.35]  # kept in run order


def test_rows_per_size_and_missing_measurements():
    arms = {
        "baseline": [child_doc(1.0, sizes=(1 << 20, 268435456))],
        "profile": [{"error": "rc 1, no probe JSON: Segmentation fault"}],
    }
    rows = nccl_compare.compare_rows(SETS, [1 << 20, 268435456], arms)
    assert [(r["gpus"], r["bytes"]) for r in rows] == [
        ([0, 1], 1 << 20),
        ([0, 1], 268435456),
        ([0, 1, 2, 3], 1 << 20),
        ([0, 1, 2, 3], 268435456),
    ]
    assert rows[0]["baseline"] == 33.85 and rows[1]["baseline"] == 338.5
    assert all(r["profile"] is None and r["ratio"] is None for r in rows)
    assert rows[0]["profile_reason"] == "rc 1, no probe JSON: Segmentation fault"
    failed = child_doc(1.0)
    failed["bandwidth"]["probes"][0].update(status="failed", reason="RuntimeError: NCCL error: invalid usage")
    rows = nccl_compare.compare_rows(
        SETS[:1], [268435456], {"baseline": [failed], "profile": [child_doc(1.0)]}
    )
    assert rows[0]["baseline"] is None and "invalid usage" in rows[0]["baseline_reason"]


def test_exit_code_and_table():
    ok = {
        "rows": nccl_compare.compare_rows(
            SETS, [268435456], {"baseline": [child_doc(1.0)], "profile": [child_doc(1.08)]}
        ),
        "profile": "pcie-2numa",
        "errors": [],
        "notes": ["safety kept"],
    }
    assert nccl_compare.exit_code(ok) == 0
    buf = io.StringIO()
    nccl_compare.render(ok, Console(file=buf, width=140, color_system=None))
    text = buf.getvalue()
    assert "+ profile pcie-2numa" in text and "1.080" in text and "256 MiB" in text and "338.50" in text
    assert nccl_compare.exit_code({**ok, "errors": ["profile: timed out"]}) == 1
    assert nccl_compare.exit_code({**ok, "rows": []}) == 1
    assert nccl_compare.human_size(1 << 20) == "1 MiB" and nccl_compare.human_size(1000) == "1000 B"


def test_probe_argv_is_an_argv_list():
    argv = nccl_compare.probe_argv(
        "/venv/bin/python3", [[0, 1], [0, 1, 2, 3]], [1 << 20, 256 << 20], quick=True
    )
    assert argv[0] == "/venv/bin/python3" and argv[1].endswith("hwtune/probe.py")
    assert argv[2:] == [
        "--no-copies",
        "--no-p2p",
        "--allreduce-sets",
        "0,1;0,1,2,3",
        "--allreduce-bytes",
        "1048576,268435456",
        "--quick",
    ]


def test_cli_end_to_end_without_gpus(capsys):
    """Both arms really run (two child processes); without a GPU each row says why, exit 1."""
    rc, out, _ = gpubox(
        capsys,
        "probe",
        "--local",
        "--nccl-compare",
        "pcie-2numa",
        "--allreduce-sets",
        "0,1;0,1,2,3",
        "--sizes",
        "1M",
        "--json",
    )
    res = json.loads(out)
    assert rc == 1 and res["schema"] == "gpubox.nccl-compare/1" and res["errors"] == []
    assert [r["gpus"] for r in res["rows"]] == [[0, 1], [0, 1, 2, 3]] and res["sizes"] == [1 << 20]
    assert all(r["baseline"] is None and r["baseline_reason"] for r in res["rows"])
    assert res["child_env"]["profile"][0]["NCCL_PROTO"] == "LL"
    assert res["notes"][0] == "sets given with --allreduce-sets"


def test_cli_without_gpus_and_without_sets_compares_nothing(capsys):
    from gpubox.hwtune.topology import discover_local

    if discover_local().gpus:
        pytest.skip("this machine has GPUs")
    rc, out, _ = gpubox(capsys, "probe", "--local", "--nccl-compare", "nccl-defaults")
    assert rc == 1 and "nothing to compare" in out


def test_cli_bad_sizes_and_unknown_profile(capsys):
    rc, _, err = gpubox(capsys, "probe", "--local", "--nccl-compare", "pcie-2numa", "--sizes", "lots")
    assert rc == 2 and "--sizes 'lots'" in err
    rc, _, err = gpubox(capsys, "probe", "--local", "--nccl-compare", "pcie-2numaa")
    assert rc == 2 and "did you mean pcie-2numa" in err
    rc, _, err = gpubox(capsys, "probe", "--local", "--sizes", "1M")
    assert rc == 2
