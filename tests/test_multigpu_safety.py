"""NVLink-multicast safety of the NCCL profile comparison (issue 12): every child process keeps
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 whatever the
profile or the caller's environment says, proven by what real child processes report they saw."""

import os
import sys

import pytest

from gpubox.errors import GpuboxError
from gpubox.hwtune import nccl_compare
from gpubox.hwtune.nccl import load_profile
from gpubox.hwtune.nccl_compare import SAFETY_ENV, child_env, profile_conflicts
from tests.clirun import gpubox

BAD_PROFILE = """\
name: multicast-on
description: tries to switch NVLink multicast back on
env:
  NCCL_NVLS_ENABLE: 1
  NCCL_PROTO: Simple
"""


def test_profile_with_nvls_enable_1_ends_with_0_in_the_child_env():
    env, forced = child_env({"PATH": "/usr/bin"}, {"NCCL_NVLS_ENABLE": "1", "NCCL_PROTO": "LL"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_PROTO"] == "LL" and env["PATH"] == "/usr/bin"
    assert {k: env[k] for k in SAFETY_ENV} == SAFETY_ENV
    assert "NCCL_NVLS_ENABLE" in forced


def test_caller_environment_cannot_turn_it_on_either():
    base = {"NCCL_NVLS_ENABLE": "2", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "NVSHMEM_DISABLE_NVLS": "1"}
    env, forced = child_env(base)
    assert {k: env[k] for k in SAFETY_ENV} == SAFETY_ENV
    assert sorted(forced) == ["NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"]
    assert base["NCCL_NVLS_ENABLE"] == "2"  # the caller's mapping is not modified


@pytest.mark.parametrize(
    "env,bad",
    [
        ({"NCCL_NVLS_ENABLE": "1"}, "NCCL_NVLS_ENABLE=1"),
        ({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, "TORCH_SYMM_MEM_DISABLE_MULTICAST=0"),
        ({"NVSHMEM_DISABLE_NVLS": "0"}, "NVSHMEM_DISABLE_NVLS=0"),
        ({"NCCL_ALGO": "Ring,NVLS"}, "NCCL_ALGO=Ring,NVLS"),
        ({"NCCL_ALGO": "allreduce:nvlstree;broadcast:ring"}, "NCCL_ALGO=allreduce:nvlstree"),
        ({"NCCL_ALGO": "^NVLS,NVLSTree"}, None),  # an exclusion keeps NVLS out: fine
        ({"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"}, None),
    ],
)
def test_profile_conflicts(env, bad):
    got = profile_conflicts(env)
    if bad is None:
        assert got == []
    else:
        assert len(got) == 1 and got[0].startswith(bad)


def test_shipped_profiles_do_not_conflict():
    for name in ("pcie-2numa", "nccl-defaults", "debug-init"):
        assert profile_conflicts(load_profile(name).env) == []


def test_cli_refuses_a_profile_that_sets_nvls(capsys, tmp_path):
    f = tmp_path / "multicast-on.yaml"
    f.write_text(BAD_PROFILE)
    rc, out, err = gpubox(capsys, "probe", "--local", "--nccl-compare", str(f), "--allreduce-sets", "0,1")
    assert rc == 2 and out == ""
    assert "would turn NVLink multicast back on: NCCL_NVLS_ENABLE=1" in err and "Traceback" not in err


def test_real_children_see_the_safety_values_even_when_forced(tmp_path):
    """Run both arms as real child processes (hwtune/probe.py) with a profile and a caller
    environment that both set NCCL_NVLS_ENABLE=1: each child's own record says 0."""
    f = tmp_path / "multicast-on.yaml"
    f.write_text(BAD_PROFILE)
    prof = load_profile(str(f))
    base = {**os.environ, "NCCL_NVLS_ENABLE": "1", "NVSHMEM_DISABLE_NVLS": "0"}
    res = nccl_compare.run(
        prof,
        [{"tp": 2, "gpus": [0, 1], "crosses_numa": None, "reason": "test"}],
        sizes=[1 << 20],
        base_env=base,
        allow_conflicts=True,
        timeout=120,
    )
    assert res["errors"] == []
    for arm in ("baseline", "profile"):
        (seen,) = res["child_env"][arm]
        assert {k: seen.get(k) for k in SAFETY_ENV} == SAFETY_ENV, arm
    assert res["child_env"]["profile"][0]["NCCL_PROTO"] == "Simple"  # the rest of the profile applies
    assert "NCCL_PROTO" not in res["child_env"]["baseline"][0]
    assert any("overridden by the safety" in n for n in res["notes"])
    assert (
        "NCCL_NVLS_ENABLE" in res["forced"]["profile"] and "NVSHMEM_DISABLE_NVLS" in res["forced"]["baseline"]
    )


def test_a_child_that_did_not_get_the_safety_is_an_error_not_a_figure(tmp_path):
    """A launcher that tampers with the environment (here: a wrapper re-enabling NVLS) is caught
    from the child's own report."""
    wrapper = tmp_path / "python-tamper"
    wrapper.write_text(f'#!/bin/sh\nNCCL_NVLS_ENABLE=1 exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    res = nccl_compare.run(
        load_profile("pcie-2numa"),
        [{"tp": 2, "gpus": [0, 1], "crosses_numa": None, "reason": "t"}],
        sizes=[1 << 20],
        python=str(wrapper),
        timeout=120,
    )
    assert len(res["errors"]) == 2 and all(
        "without the NVLS safety: NCCL_NVLS_ENABLE='1'" in e for e in res["errors"]
    )
    assert res["rows"][0]["baseline"] is None and nccl_compare.exit_code(res) == 1


def test_run_refuses_conflicts_before_starting_anything(tmp_path):
    prof = load_profile("pcie-2numa")
    prof.env = {**prof.env, "NCCL_ALGO": "NVLS"}
    with pytest.raises(GpuboxError, match="NCCL_ALGO=NVLS"):
        nccl_compare.run(prof, [{"tp": 2, "gpus": [0, 1]}], python=str(tmp_path / "never-run"))


def test_run_script_exports_the_safety_and_refuses_without(tmp_path):
    """benchmarks/multigpu_run.sh: exports the three values itself; its guard is what stops it
    if someone edits that line away (checked here by feeding it a copy without the export)."""
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "benchmarks" / "multigpu_run.sh"
    text = src.read_text()
    assert "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1" in text
    broken = tmp_path / "benchmarks" / "multigpu_run.sh"
    broken.parent.mkdir()
    broken.write_text(
        text.replace(
            "export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1",
            "export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1",
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "NCCL_NVLS_ENABLE"}
    r = subprocess.run(
        ["bash", str(broken)],
        env={**env, "OUT": str(tmp_path / "out")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "NCCL_NVLS_ENABLE is not 0: stop" in r.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["run.log"]
