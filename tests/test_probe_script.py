"""The standalone probe script, run for real as `python3 - ARGS < probe.py` (how gpubox sends it
to a container): on a machine without a GPU it must say what is missing and exit 0."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.hwtune import probe

SCRIPT = Path(probe.__file__).read_text()


def run_script(*args, isolated=False):
    argv = [sys.executable, *(["-I", "-S"] if isolated else []), "-", *args]
    r = subprocess.run(argv, input=SCRIPT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


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
    r = subprocess.run(
        [sys.executable, "-", "--bogus"], input=SCRIPT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "--bogus" in r.stderr


def test_helpers():
    assert probe.norm_bdf("00000000:17:00.0") == "0000:17:00.0"
    assert probe.norm_bdf(b"00000001:B3:00.1") == "0001:b3:00.1"
    assert probe.parse_sets("0,1,2,3;4,5,6,7") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert probe.parse_sets("") == [] and probe.parse_sets(None) is None
    assert probe.default_sets(1) == []
    assert probe.default_sets(4) == [[0, 1], [2, 3], [0, 1, 2, 3]]
    assert probe.default_sets(8)[-1] == list(range(8))
    assert probe._reasons(0x41) == {"mask": 0x41, "active": ["gpu_idle", "hw_thermal_slowdown"]}
