"""The standalone probe script, run for real as the payload gpubox sends to a container
(gpubox.transport.payload: the entry and the probe_* modules it imports, served from memory):
on a machine without a GPU it must say what is missing and exit 0."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.hwtune import probe, probe_common, probe_nvml
from gpubox.transport import payload

ENTRY = probe.__name__


def _run(*args, flags=()):
    p = payload.build(ENTRY)
    argv = p.argv(sys.executable, args, flags)
    return subprocess.run(argv, input=p.stdin(), capture_output=True, timeout=60)


def run_script(*args, isolated=False):
    r = _run(*args, flags=["-I", "-S"] if isolated else [])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_payload_ships_every_part_of_the_probe():
    mods = set(payload.build(ENTRY).modules)
    parts = {
        f"gpubox.hwtune.{m}"
        for m in ("probe", "probe_common", "probe_nvml", "probe_topology", "probe_bandwidth")
    }
    assert parts <= mods and not any(".probe_verdict" in m or ".probe_doc" in m for m in mods)


def test_script_run_by_path_finds_its_parts():
    """`python3 hwtune/probe.py` (benchmarks/multigpu_run.sh, the NCCL comparison's children): the
    probe_* modules next to it, no gpubox install (-I)."""
    r = subprocess.run(
        [sys.executable, "-I", "-S", str(Path(probe.__file__)), "--no-bandwidth"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["schema"] == probe.SCHEMA


def test_script_from_stdin_reports_absence_without_crashing():
    doc = run_script("--quick")
    assert doc["schema"] == probe.SCHEMA
    if doc["nvml"]["status"] == "ok":
        pytest.skip("this machine has an NVIDIA GPU")
    assert doc["nvml"]["status"] == "skipped" and "NVML" in doc["nvml"]["reason"]
    assert doc["bandwidth"]["status"] == "skipped" and doc["bandwidth"]["reason"]
    assert doc["xid"]["status"] == "skipped"


def test_script_without_site_packages_names_the_missing_modules():
    # -I -S: no site-packages, so neither pynvml nor torch can be imported (a bare python3).
    doc = run_script(isolated=True)
    assert doc["nvml"]["status"] == "skipped"
    assert doc["nvml"]["reason"].startswith(f"pynvml not importable by {sys.executable} (ModuleNotFoundError")
    assert doc["torch"]["status"] == "skipped" and "torch not importable" in doc["torch"]["reason"]


def test_no_bandwidth_flag():
    doc = run_script("--no-bandwidth", "--allreduce-sets", "0,1;2,3")
    assert doc["bandwidth"] == {"status": "skipped", "reason": "bandwidth probes off (--no-bandwidth)"}


def test_bad_option_is_an_argparse_error():
    r = _run("--bogus")
    assert r.returncode == 2 and b"--bogus" in r.stderr


def test_helpers():
    assert probe_common.norm_bdf("00000000:17:00.0") == "0000:17:00.0"
    assert probe_common.norm_bdf(b"00000001:B3:00.1") == "0001:b3:00.1"
    assert probe.parse_sets("0,1,2,3;4,5,6,7") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert probe.parse_sets("") == [] and probe.parse_sets(None) is None
    assert probe.default_sets(1) == []
    assert probe.default_sets(4) == [[0, 1], [2, 3], [0, 1, 2, 3]]
    assert probe.default_sets(8)[-1] == list(range(8))
    assert probe_nvml.reasons_of(0x41) == {"mask": 0x41, "active": ["gpu_idle", "hw_thermal_slowdown"]}
