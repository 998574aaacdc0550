"""`gpubox probe` end to end: on a recorded real H200 run (--input), on a simulated box through its
container transport (no GPU there: skipped, exit 0), and the gpu-probe step in the step engine."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from gpubox import simbox
from gpubox.context import Context
from gpubox.hwtune import gpu_probe_step
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.steps import SKIPPED
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "probe"


@pytest.fixture
def sim(tmp_path):
    return simbox.build(tmp_path / "box")


def set_ct_vars(sim, **kv):
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"][sim.box].update(kv)
    sim.inventory_path.write_text(yaml.safe_dump(inv))


def test_input_real_h200_json(capsys):
    rc, out, _ = gpubox(capsys, "probe", "--input", str(FIX / "h200_real.json"), "--json")
    assert rc == 0
    rep = json.loads(out)
    assert rep["schema"] == "gpubox.probe-report/1" and rep["ok"] is True
    real = json.loads((FIX / "h200_real.json").read_text())
    h2d = next(p for p in real["bandwidth"]["probes"] if p["name"] == "h2d")["gbps"]
    assert rep["gpus"][0]["h2d_gbps"] == h2d and rep["gpus"][0]["link_gbps"] == 63.0
    assert {s["name"] for s in rep["steps"]} >= {"gpu0 link", "gpu0 h2d", "gpu0 d2d", "xid"}


def test_input_table_and_degraded_exit_1(capsys, tmp_path):
    rc, out, _ = gpubox(capsys, "probe", "--input", str(FIX / "h200_real.json"))
    assert rc == 0 and "GPU probe" in out and "Gen5 x16" in out
    doc = json.loads((FIX / "h200_real.json").read_text())
    bad = copy.deepcopy(doc)
    bad["bandwidth"]["probes"][0]["link_under_load"]["width"] = 8
    f = tmp_path / "x8.json"
    f.write_text(json.dumps(bad))
    rc, out, _ = gpubox(capsys, "probe", "--input", str(f))
    assert rc == 1 and "x8 of x16" in out


def test_bad_invocations_exit_2(capsys, tmp_path):
    rc, _, err = gpubox(capsys, "probe")
    assert rc == 2 and "nothing to probe" in err and len(err.strip().splitlines()) == 1
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    rc, _, err = gpubox(capsys, "probe", "--input", str(junk))
    assert rc == 2 and "did not print probe JSON" in err
    rc, _, err = gpubox(capsys, "probe", "--local", "--input", str(junk))
    assert rc == 2 and "exclude" in err


def test_sim_box_without_gpu_is_skipped_not_failed(capsys, sim):
    rc, out, _ = gpubox(capsys, "-i", str(sim.inventory_path), "probe", sim.box, "--json")
    rep = json.loads(out)
    # skipped, not failed; and not ok either: nothing was checked (issue 29), so exit 1
    assert rc == 1 and rep["ok"] is False
    assert {s["status"] for s in rep["steps"]} == {"skipped"}
    # the script really ran in the simulated container (its document came back through the transport)
    assert rep["probe"]["schema"] == "gpubox.probe/1" and rep["probe"]["seconds"] >= 0


def test_sim_box_limits_from_inventory_judge_a_recorded_run(capsys, sim):
    set_ct_vars(sim, gpubox_probe={"h2d_min_pct": 95})
    rc, out, _ = gpubox(
        capsys,
        "-i",
        str(sim.inventory_path),
        "probe",
        sim.box,
        "--json",
        "--input",
        str(FIX / "h200_real.json"),
    )
    rep = json.loads(out)
    assert rc == 1 and [s["name"] for s in rep["steps"] if s["status"] == "drift"] == ["gpu0 h2d"]


@pytest.mark.parametrize(
    "value,words",
    [
        ({"h2d_min_pct": 700}, "not a percentage"),
        ({"python": "/nonexistent/python3"}, "not found on"),
    ],
)
def test_sim_box_bad_settings_exit_2(capsys, sim, value, words):
    set_ct_vars(sim, gpubox_probe=value)
    rc, _, err = gpubox(capsys, "-i", str(sim.inventory_path), "probe", sim.box)
    assert rc == 2 and words in err


def test_gpu_probe_step_in_check_and_apply_modes(sim):
    set_ct_vars(sim, gpubox_gpus=8, gpubox_bench={"tp": [1, 4, 8]})
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box(sim.box), inventory=inv)
    assert gpu_probe_step.box_limits(ctx.box)["allreduce_sets"] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        list(range(8)),
    ]
    for mode in ("check", "apply"):
        rep = run_steps(ctx, gpu_probe_step.steps(ctx), mode)
        (res,) = rep.steps
        assert res.name == "gpu-probe" and res.status == SKIPPED and not res.changed
        assert "no NVML" in res.detail or "pynvml" in res.detail
        assert not rep.ok and rep.recap()["skipped"] == 1  # nothing checked: not ok (issue 29)
    ctx.close()


def test_gpu_probe_step_fails_in_one_line_when_the_interpreter_is_missing(sim):
    set_ct_vars(sim, gpubox_probe={"python": "/nonexistent/python3"})
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box(sim.box), inventory=inv)
    (res,) = run_steps(ctx, gpu_probe_step.steps(ctx), "check").steps
    assert res.status == "failed" and "/nonexistent/python3 not found" in res.detail
    ctx.close()
