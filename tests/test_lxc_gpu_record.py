"""The real-GPU run (tests/fixtures/lxc/gpu/h200_real_lxc.json, recorded by tests/gpu_lxc_record.py on
an H200 with Debian's lxc): a container allowing only `c 195:*`, or a stale uvm major, gets EPERM on
/dev/nvidia-uvm and cuInit 999 while nvidia-smi works; `gpubox lxc check` names the cause in that
real container and `gpubox lxc fix` makes CUDA work inside. The recorded documents are checked here
(they cannot be made again without the GPU), and the start model must read the recorded config and
/proc/devices the way the real container behaved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubox.provision.lxcconf import LxcConf
from gpubox.provision.lxcmodel import StartModel

DOC = json.loads((Path(__file__).parent / "fixtures/lxc/gpu/h200_real_lxc.json").read_text())
CASES = DOC["cases"]


def _steps(run: dict) -> dict:
    return {s["name"]: s for s in json.loads(run["stdout"])["steps"]}


def _model(text: str) -> StartModel:
    conf = LxcConf.parse(text)
    entries = [(i, l.key, (l.value or "").strip()) for i, l in enumerate(conf.main.lines) if l.key]
    return StartModel.build(entries, lambda p: None, lambda p: True)


def test_it_ran_on_real_lxc_on_the_hosts_own_cgroup2():
    assert DOC["runtime"]["real"] and not DOC["runtime"]["hybrid"]
    assert DOC["cgroup_mount"] and " - cgroup2 cgroup2 " in DOC["cgroup_mount"][0]
    assert "H200" in DOC["nvidia_smi_host"]["stdout"]
    assert {c["case"] for c in CASES} == {"only_195", "stale_uvm"}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["case"])
def test_before_the_fix_uvm_is_denied_and_cuda_fails_while_nvidia_smi_works(case):
    assert case["pct_start"]["rc"] == 0
    assert case["nvidia_smi_before"]["rc"] == 0 and "NVIDIA H200" in case["nvidia_smi_before"]["stdout"]
    assert case["alloc_before"]["rc"] != 0 and "CUDA unknown error" in case["alloc_before"]["stderr"]
    assert case["check_before"]["rc"] == 1
    steps = _steps(case["check_before"])
    assert steps["cuda"]["status"] == "failed"
    assert "cuInit(0) = 999" in steps["cuda"]["detail"]
    assert "denies /dev/nvidia-uvm" in steps["cuda"]["detail"]
    uvm = case["uvm_major"]
    assert (
        f"nvidia-uvm (major {uvm})" in steps["container-config"]["detail"]
        or "stale" in steps["container-config"]["detail"]
    )
    assert not _model(case["config_before"]).permitted(uvm, 0)  # the model agrees with the kernel


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["case"])
def test_after_gpubox_lxc_fix_cuda_works_inside(case):
    uvm = case["uvm_major"]
    assert case["fix"]["rc"] == 0
    assert f"lxc.cgroup2.devices.allow: c {uvm}:* rwm" in case["config_after"]
    before_foreign = [l for l in case["config_before"].splitlines() if not l.startswith("lxc.")]
    assert [l for l in case["config_after"].splitlines() if not l.startswith("lxc.")] == before_foreign
    assert case["check_after"]["rc"] == 0
    steps = _steps(case["check_after"])
    assert all(s["status"] == "ok" for s in steps.values()), steps
    assert "cuInit(0) = 0" in steps["cuda"]["detail"]
    assert case["alloc_after"]["rc"] == 0 and "cuda ok 1024.0" in case["alloc_after"]["stdout"]
    assert _model(case["config_after"]).permitted(uvm, 0)
