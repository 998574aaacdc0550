"""End to end on the simulated box: `gpubox bench BOX` launches the simulator through the custom
launcher path, measures, writes a valid result and a verdict; the server_fail fault gives a failed
verdict with the log tail; `gpubox bench run --url`; bad input exits 2; the recover step.

No assertion here rests on this machine keeping pace (CI is a loaded 2-core machine): the
simulator writes, per request, when it meant to send the first and last token (its own clock)
next to when it did (--truth-file). Rates are checked on its clock; the client's figure is checked
against what the simulator really sent, with the slack this run itself showed; a healthy verdict
is required unless the simulator fell behind its own schedule (tests/test_bench_simtuning.py does
the same)."""

import json
import statistics

import pytest
import yaml

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


LATE = 1.02  # the simulator sent its last token 2% later than it planned: the machine fell behind
SLACK = 5e-5  # kernel stamps are CLOCK_REALTIME, mapped onto perf_counter to within a few microseconds


def _with_truth(sim, truth):
    """The box's simulated server writes its per-request truth (--truth-file) to `truth`."""
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"]["extra_args"] = [
        "--truth-file",
        str(truth),
    ]
    sim.inventory_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return truth


def _truth(truth, tp=None, single=True):
    """The simulator's 1024-token requests (of one TP), single-stream ones only by default (no
    other request overlapping), each with its planned decode rate (its own clock), the rate it
    really sent at, and lag = sent decode time / planned decode time (1.0: on schedule)."""
    rows = [json.loads(line) for line in truth.read_text().splitlines()]
    rows = [r for r in rows if r["output_tokens"] == 1024 and (tp is None or r["tp"] == tp)]
    out = []
    for r in rows:
        overlap = any(o is not r and o["t_recv"] < r["t_last"] and r["t_recv"] < o["t_last"] for o in rows)
        if single and overlap:
            continue
        plan = r["plan_e2e_s"] - r["plan_ttft_s"]
        sent = r["e2e_s"] - r["ttft_s"]
        out.append({**r, "plan_rate": 1023 / plan, "sent_rate": 1023 / sent, "lag": sent / plan})
    return out


def _lags(truth):
    return [r["lag"] for r in _truth(truth, single=False)]


def test_bench_box_healthy_json(sim, tmp_path, capsys):
    truth = _with_truth(sim, tmp_path / "truth.jsonl")
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
    lags = _lags(truth)
    assert (rc == 0 and doc["verdict"]["status"] == "healthy") or max(lags) > LATE, (doc["verdict"], lags)
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
    tp4 = _truth(truth, tp=4)
    # the seed's pacing x speed on the simulator's own clock (no load in it) ...
    assert statistics.median(r["plan_rate"] for r in tp4) == pytest.approx(281.1 * 20, rel=0.15)
    # ... and each of the client's decode times lies where the simulator's own stamps put it: the
    # first token arrived inside its write call (or later: read together with later tokens, which
    # the sample's clock says), the end of the body inside the last write call
    assert len(d4["samples"]) == len(tp4)
    for smp, t in zip(d4["samples"], tp4):
        decode = smp["e2e_s"] - smp["ttft_s"]
        assert decode <= t["t_end_written"] - t["t_first"] + 2 * SLACK, (smp, t)
        if (smp["clock"] or "").endswith("/kernel"):  # the first token was read alone
            assert decode >= t["t_last"] - t["t_first_written"] - 2 * SLACK, (smp, t)
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
    truth = _with_truth(sim, tmp_path / "truth.jsonl")
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
    assert "SIMULATED" in out and "tp4/ddtree:15/decode/out1024" in out.replace("\n", "")
    # on its own clock the simulated box is healthy (its planned rate within the expectation) ...
    assert statistics.median(r["plan_rate"] for r in _truth(truth)) == pytest.approx(5622.0, rel=0.15)
    # ... so the verdict is healthy, unless this machine made the simulator fall behind its plan
    lags = _lags(truth)
    if "verdict: healthy" in out:
        assert rc == 0
    else:
        assert rc == 1 and "verdict: degraded" in out and max(lags) > LATE, (out, lags)


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
    truth = tmp_path / "truth.jsonl"
    with simserver(
        tmp_path, "--method", "ddtree", "--tp", "4", "--speed", "50", "--truth-file", str(truth)
    ) as s:
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
    assert doc["url"] == s.url and results.validate(doc) == []
    assert doc["measurements"][0]["key"] == "tp4/ddtree:15/decode/out1024"
    # measured ok, unless the simulator itself fell behind (a late server sends its tokens in bursts)
    assert (rc == 0 and doc["verdict"]["status"] == "healthy") or max(_lags(truth)) > LATE, doc["verdict"]
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


def test_progress_in_a_pipe_is_a_line_per_measurement():
    """rich draws its bar only on a terminal: in a pipe the benchmark says each measurement as it
    starts, counted, instead of nothing until the table."""
    import io

    from rich.console import Console

    from gpubox.bench.measure import _progress

    buf = io.StringIO()
    prog, step = _progress(Console(file=buf, force_terminal=False), 2)
    assert prog is None
    step("TP1 auto: starting server", advance=False)
    step("TP1 auto decode 1024", advance=False)
    step("")
    step("TP1 auto concurrency 8", advance=False)
    step("")
    assert buf.getvalue().splitlines() == [
        "bench [1/2] TP1 auto: starting server",
        "bench [1/2] TP1 auto decode 1024",
        "bench [2/2] TP1 auto concurrency 8",
    ]
