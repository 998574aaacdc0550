"""End to end on the simulated box: `gpubox bench BOX` launches the simulator through the custom
launcher path, measures, writes a valid result and a verdict; the server_fail fault gives a failed
verdict with the log tail; `gpubox bench run --url`; bad input exits 2; the recover step."""

import json

import pytest

from gpubox.bench import results
from gpubox.bench.bench_step import BenchStep
from gpubox.context import Context
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.simbox import build
from tests.bench_helpers import simserver
from tests.clirun import gpubox


@pytest.fixture
def sim(tmp_path):
    return build(tmp_path / "box")


def test_bench_box_healthy_json(sim, tmp_path, capsys):
    rc, out, err = gpubox(
        capsys,
        "-i",
        sim.inventory_path,
        "bench",
        "ct200",
        "--tp",
        "4,8",
        "--methods",
        "ddtree:15",
        "--out",
        tmp_path / "out",
        "--json",
    )
    doc = json.loads(out)
    assert rc == 0, doc["verdict"]
    assert results.validate(doc) == []
    assert doc["simulated"] is True and doc["sim_speed"] == 20
    assert [s["tp"] for s in doc["servers"]] == [4, 8]
    assert doc["servers"][0]["command"][1:3] == ["-m", "gpubox.simbox.simserver"]
    assert doc["servers"][0]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    keys = [m["key"] for m in doc["measurements"]]
    assert keys == [
        "tp4/ddtree:15/decode/out1024",
        "tp4/ddtree:15/concurrency/c8",
        "tp8/ddtree:15/decode/out1024",
        "tp8/ddtree:15/concurrency/c8",
    ]
    d4 = doc["measurements"][0]
    assert d4["tok_s"] == pytest.approx(281.1 * 20, rel=0.15)  # the simulator's real pacing
    assert d4["acceptance"]["mean_length"] > 5
    assert (tmp_path / "out" / f"{doc['run_id']}.json").exists()


def test_bench_server_fail_fault(tmp_path, capsys):
    sim = build(tmp_path / "box", ["server_fail"])
    rc, out, err = gpubox(
        capsys,
        "-i",
        sim.inventory_path,
        "bench",
        "ct200",
        "--tp",
        "1",
        "--methods",
        "ddtree:15",
        "--out",
        tmp_path / "out",
        "--json",
    )
    doc = json.loads(out)
    assert rc == 1 and doc["verdict"]["status"] == "failed"
    srv = doc["servers"][0]
    assert srv["status"] == "failed" and "during start-up" in srv["error"]
    assert "CUDA error" in srv["log_tail"]
    assert all(
        m["status"] == "failed" and m["reason"].startswith("server did not start")
        for m in doc["measurements"]
    )
    assert results.validate(doc) == []


def test_bench_table_output(sim, tmp_path, capsys):
    rc, out, err = gpubox(
        capsys,
        "-i",
        sim.inventory_path,
        "bench",
        "ct200",
        "--tp",
        "4",
        "--methods",
        "ddtree:15",
        "--out",
        tmp_path / "out",
    )
    assert rc == 0
    assert "SIMULATED" in out and "verdict: healthy" in out


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--tp", "16"], "TP 16 needs 16 GPUs"),
        (["--methods", "nope"], "unknown method 'nope'"),
        (["--profile", "huge"], "unknown benchmark profile 'huge'"),
    ],
)
def test_bad_input_exits_2(sim, capsys, args, msg):
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "bench", "ct200", *args)
    assert rc == 2 and msg in err and "Traceback" not in err


def test_bench_run_url(tmp_path, capsys):
    with simserver(tmp_path, "--method", "ddtree", "--tp", "4", "--speed", "50") as s:
        rc, out, err = gpubox(
            capsys,
            "bench",
            "run",
            "--url",
            s.url,
            "--tp",
            "4",
            "--method",
            "ddtree:15",
            "--out",
            tmp_path / "out",
            "--json",
        )
    doc = json.loads(out)
    assert rc == 0 and doc["url"] == s.url and results.validate(doc) == []
    assert doc["measurements"][0]["key"] == "tp4/ddtree:15/decode/out1024"
    rc, out, err = gpubox(capsys, "bench", "run", "--url", s.url)  # now stopped
    assert rc == 2 and "no OpenAI-compatible server answers" in err


def test_bench_step_check_apply_verify(sim, tmp_path):
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv, options={"bench_out": str(tmp_path / "out")})
    ctx.box.container.vars["gpubox_bench"].update(tp=[4], methods=["ddtree:15"])
    step = BenchStep()
    rep = run_steps(ctx, [step], "plan")
    assert rep.steps[0].status == "drift" and "no benchmark result" in rep.steps[0].detail
    assert rep.steps[0].commands[0][0] == "CUDA_VISIBLE_DEVICES=0,1,2,3"
    rep = run_steps(ctx, [BenchStep()], "apply")
    assert rep.steps[0].status == "fixed", rep.steps[0].detail
    rep = run_steps(ctx, [BenchStep()], "apply")  # second run: a fresh healthy result, nothing to do
    assert rep.steps[0].status == "ok" and not rep.steps[0].changed
