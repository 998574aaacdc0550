"""`gpubox advise` and the advice section: the seed's real tables give the seed's decisions (TP4
DDTree b15 for single and concurrent requests, TP8 at 100k context) with margins checked against
the noise; simulated runs with a known answer cover a margin inside the noise, no noise estimate,
history as the noise source, context and concurrency switches, and runs the data lacks."""

import copy
import json
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from gpubox.bench.report.advice import (
    CLEAR,
    NOISE_K,
    UNKNOWN,
    WITHIN,
    advise,
    allreduce_busbw,
    d2,
    kv_cache,
)
from gpubox.bench.report.advice_io import server_logs
from gpubox.bench.report.data import from_doc, load_run
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "results"
PROBE_FIX = Path(__file__).parent / "fixtures" / "probe"
AFTER, PARTIAL = str(FIX / "seed-after.json"), str(FIX / "partial.json")
HOSTILE_BOX = json.loads(Path(PARTIAL).read_text())["box"]
HAVE_TEX = bool(shutil.which("latexmk") or shutil.which("pdflatex")) and bool(shutil.which("pdftotext"))


def seed():
    return load_run(AFTER)


def by_id(a):
    return {w.id: w for w in a.workloads}


def names(w):
    return [(p.config.name, p.value) for p in w.ranking]


# --- the seed's real tables ---------------------------------------------------------------------


def test_seed_single_request_is_tp4_ddtree_b15_beyond_the_noise():
    a = advise(seed())
    w = by_id(a)["decode/out1024"]
    assert w.best.config.name == "TP4 DDTree b15" and w.runner_up.config.name == "TP8 DDTree b15"
    assert ("TP1 DDTree b15", 173.4) in names(w)  # the seed's TP1/TP4/TP8 row: 173.4/281.1/263.9
    assert round(w.margin, 1) == 17.2 and w.decision == CLEAR and w.noise_source == "repeats"
    # the noise is the pooled sd of the two figures' spreads over 3 repetitions (range / d2(3))
    sds = [
        (m.tok_s_spread[1] - m.tok_s_spread[0]) / d2(3)
        for m in seed().select("decode", output_len=1024, label="ddtree:15")
        if m.tp in (4, 8)
    ]
    assert w.noise_sd == pytest.approx((sum(s * s for s in sds) / 2) ** 0.5)
    assert w.margin > NOISE_K * w.noise_sd
    assert "exceeds the noise" in w.verdict and "+17.2 tok/s (+6.5%) over TP8 DDTree b15" in w.verdict


def test_seed_reasons_come_from_the_findings():
    w = by_id(advise(seed()))["decode/out1024"]
    why = " | ".join(w.reasons)
    assert "TP8 spans NUMA nodes 0 and 1 over PCIe, TP4 stays on node 0" in why
    assert "auto is flat across TP (37.6/37.8/37.6 tok/s at TP1/4/8)" in why
    assert "budget 15 beat 16/32/64 at TP1 (173.4 vs 170.2/161.5/140.8 tok/s)" in why
    assert "acceptance length grew 6.2 -> 7.4" in why and "peaks early" in why


def test_seed_concurrency_and_long_context():
    ws = by_id(advise(seed()))
    c8 = ws["concurrency/c8/out1024"]
    assert (c8.best.config.name, c8.best.value) == ("TP4 DDTree b15", 1270.8)
    assert (c8.runner_up.config.name, c8.runner_up.value) == ("TP8 DDTree b15", 727.0)
    assert c8.unit == "aggregate tok/s" and c8.decision == CLEAR
    assert "per-request spread scaled to the aggregate" in c8.best.noise.detail
    lc = ws["long_context/ctx100000/out256"]
    assert [(p.config.name, p.value) for p in lc.ranking] == [
        ("TP8 DDTree b15", 35.2),
        ("TP4 DDTree b15", 5.7),
    ]
    assert lc.decision == CLEAR
    assert any("shards the KV cache over 8 GPUs" in r for r in lc.reasons)
    assert any("at 100k context TP8 beats TP4 6.2x" in r for r in lc.reasons)
    # TP1 method x output length, 256/1024/2048: 123.9/173.4/168.8; agentic 4k 228.9 alone
    tp1 = [ws[f"decode/out{n}"] for n in (256, 1024, 2048)]
    assert [next(p.value for p in w.ranking if p.config.name == "TP1 DDTree b15") for w in tp1] == [
        123.9,
        173.4,
        168.8,
    ]
    ag = ws["agentic/ctx4096/out1024"]
    assert names(ag) == [("TP1 DDTree b15", 228.9)] and ag.runner_up is None and ag.margin is None


def test_seed_serving_plan_and_missing_runs():
    a = advise(seed())
    assert [(r.config.name, r.decided) for r in a.plan] == [
        ("TP4 DDTree b15", True),
        ("TP8 DDTree b15", True),
    ]
    default, switch = a.plan
    assert "single requests" in default.when and "concurrency C=1-8" in default.when
    assert "concurrency/c8/out1024" in default.workloads
    assert switch.when.startswith("prompts of 25k tokens or more")
    assert "100k tokens: 35.2 vs 5.7 tok/s" in switch.evidence
    gaps = [g.text for g in a.gaps]
    assert "TP4 DDTree b15 and TP8 DDTree b15 at 2048-token outputs not measured" in gaps
    assert "TP4 DDTree b15 and TP8 DDTree b15 at agentic 4k context not measured" in gaps
    assert any("budgets 16/32/64 at TP4" in g and "compared at TP1 only" in g for g in gaps)
    assert any(g.startswith("the context threshold for TP8 DDTree b15") for g in gaps)
    assert a.exit_code == 0


def test_seed_with_its_25k_request_cut_by_the_context_window():
    """The seed's 25k-token prompt tokenized past 32768 and got HTTP 400: a gap, never dropped."""
    doc = json.loads(Path(AFTER).read_text())
    cut = copy.deepcopy(
        next(m for m in doc["measurements"] if m["key"].startswith("tp4/ddtree:15/long_context"))
    )
    cut.update(
        key="tp1/ddtree:15/long_context/ctx25000/out256",
        tp=1,
        status="failed",
        reason="HTTP 400: prompt 33021 tokens + max_tokens 256 exceeds the server's max_model_len 32768",
        tok_s=None,
        tok_s_spread=None,
        aggregate_tok_s=None,
        ttft_s=None,
        tpot_ms=None,
        e2e_s=None,
        acceptance=None,
        samples=[],
        repetitions=0,
    )
    doc["measurements"].append(cut)
    a = advise(from_doc(doc, "seed-cut.json", "seed-cut"))
    w = by_id(a)["long_context/ctx25000/out256"]
    g = next(g for g in w.gaps if g.key == cut["key"])
    assert g.kind == "cut_by_context" and "max_model_len 32768" in g.text and g in a.gaps
    assert w.best.config.name == "TP8 DDTree b15"  # the other TPs still decide the point
    assert a.exit_code == 1  # something the run tried did not give a figure


def test_d2_is_the_expected_range_of_normal_draws():
    # published control-chart constants (Tippett 1925; SAS/QC and Origin QCD2 give 2.05875 for n=4)
    for n, v in ((2, 1.128), (3, 1.693), (4, 2.059), (5, 2.326), (10, 3.078), (25, 3.931)):
        assert d2(n) == pytest.approx(v, abs=6e-4)
    assert d2(2) == pytest.approx(2 / 3.141592653589793**0.5, abs=1e-9)  # E|X - Y| for N(0,1): 2/sqrt(pi)


def test_real_context_window_errors_are_named_as_cuts():
    errs = json.loads((FIX / "realworld" / "context_errors.json").read_text())["errors"]
    ms = [
        meas(4, "ddtree:15", "long_context", 80.0, ctx=100000, out=256, spread=[79.0, 81.0]),
        meas(8, "ddtree:15", "long_context", 90.0, ctx=100000, out=256, spread=[89.0, 91.0]),
    ]
    for i, e in enumerate(errs):
        head = f"HTTP {e['status']}: " if e["status"] else ""
        ms.append(
            meas(
                1,
                f"ddtree:{16 + i}",
                "long_context",
                None,
                ctx=100000,
                out=256,
                status="failed",
                reason=f"3 of 3 requests failed: {head}{e['message']}",
            )
        )
    # not a context cut (made up here): a 400 for a rejected field stays a plain failure
    ms.append(
        meas(
            1,
            "auto",
            "long_context",
            None,
            ctx=100000,
            out=256,
            status="failed",
            reason="HTTP 400: unknown field 'ignore_eos'",
        )
    )
    a = advise(sim_run(ms))
    kinds = [g.kind for g in a.gaps if g.key and g.key.startswith("tp1/")]
    assert kinds == ["cut_by_context"] * len(errs) + ["failed"]


# --- simulated runs with a known answer ---------------------------------------------------------


def meas(
    tp, label, workload, value, *, reps=3, spread=None, out=1024, c=1, ctx=None, status="ok", reason=None
):
    method, _, b = label.partition(":")
    if workload == "decode":
        key = f"tp{tp}/{label}/decode/out{out}"
    elif workload == "concurrency":
        key = f"tp{tp}/{label}/concurrency/c{c}/out{out}"
    else:
        key = f"tp{tp}/{label}/{workload}/ctx{ctx}/out{out}"
    ok = status == "ok"
    per_req = value / c if workload == "concurrency" else value
    return {
        "key": key,
        "tp": tp,
        "method": method,
        "budget": int(b) if b else None,
        "label": label,
        "workload": workload,
        "output_len": out,
        "concurrency": c,
        "context_tokens": ctx,
        "status": status,
        "reason": reason,
        "repetitions": reps if ok else 0,
        "tok_s": per_req if ok else None,
        "tok_s_spread": (spread if spread is not None else None) if ok else None,
        "aggregate_tok_s": value if ok and workload == "concurrency" else None,
        "acceptance": None,
        "samples": [],
    }


def sim_run(measurements, name="sim", run_id="box-1", status="healthy"):
    servers = {(m["tp"], m["label"]) for m in measurements}
    doc = {
        "schema": "gpubox.bench/1",
        "box": "simbox",
        "run_id": run_id,
        "started_at": "2026-12-01T00:00:00Z",
        "facts": {},
        "servers": [
            {"tp": tp, "label": lab, "method": lab.split(":")[0], "gpus": list(range(tp)), "status": "ok"}
            for tp, lab in sorted(servers)
        ],
        "measurements": measurements,
        "verdict": {"status": status, "reasons": []},
    }
    return from_doc(doc, f"{name}.json", name)


def test_clear_margin_is_called_beyond_the_noise():
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", 200.0, spread=[199.0, 201.0]),
                meas(8, "ddtree:15", "decode", 180.0, spread=[179.0, 181.0]),
            ]
        )
    )
    w = a.workloads[0]
    assert w.best.config.tp == 4 and w.decision == CLEAR and a.decided and a.exit_code == 0


def test_margin_inside_the_noise_is_not_a_decision():
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", 200.0, spread=[190.0, 210.0]),
                meas(8, "ddtree:15", "decode", 195.0, spread=[185.0, 205.0]),
            ]
        )
    )
    w = a.workloads[0]
    assert w.best.config.tp == 4 and w.margin == 5.0
    assert w.noise_sd == pytest.approx(20.0 / d2(3)) and w.decision == WITHIN
    assert "inside the noise" in w.verdict and "exceeds" not in w.verdict
    assert any(g.kind == "within_noise" and "more repetitions" in g.text for g in a.gaps)
    assert a.plan and not a.plan[0].decided and a.exit_code == 1


def test_no_noise_estimate_says_noise_unknown_and_never_claims_significance():
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", 300.0, reps=1, spread=[300.0, 300.0]),
                meas(8, "ddtree:15", "decode", 100.0, reps=1, spread=[100.0, 100.0]),
            ]
        )
    )
    w = a.workloads[0]
    assert w.decision == UNKNOWN and w.noise_sd is None and w.to_dict()["exceeds_noise"] is None
    assert "noise unknown" in w.verdict and "exceeds" not in w.verdict
    assert any(g.kind == "noise_unknown" for g in a.gaps)
    assert not a.plan[0].decided and a.exit_code == 1


def history_runs(values, status="healthy"):
    return [
        sim_run(
            [meas(4, "ddtree:15", "decode", v, reps=1), meas(8, "ddtree:15", "decode", v - 10, reps=1)],
            run_id=f"box-h{i}-{status}",
            status=status,
        ).doc
        for i, v in enumerate(values)
    ]


def test_history_is_the_noise_when_the_run_has_no_repeats():
    now = sim_run(
        [meas(4, "ddtree:15", "decode", 200.0, reps=1), meas(8, "ddtree:15", "decode", 190.0, reps=1)],
        run_id="box-now",
    )
    healthy = [196.0, 204.0, 199.0, 201.0]
    hist = history_runs(healthy) + history_runs([120.0, 300.0], status="degraded")  # regressions: not noise
    w = advise(now, history=hist).workloads[0]
    assert w.best.noise.source == "history" and "4 earlier healthy runs" in w.best.noise.detail
    assert w.best.noise.sd == pytest.approx(statistics.stdev(healthy))
    assert w.decision == CLEAR  # 10 > 2 x ~3.4
    # too little history: noise unknown; a damaged history entry is left out, not an error
    damaged = {"schema": "gpubox.bench/1", "run_id": "box-bad", "measurements": [{"key": "k"}]}
    w = advise(now, history=history_runs(healthy[:2]) + [damaged]).workloads[0]
    assert w.decision == UNKNOWN


def test_the_larger_of_repeats_and_history_wins():
    now = sim_run(
        [
            meas(4, "ddtree:15", "decode", 200.0, spread=[199.5, 200.5]),
            meas(8, "ddtree:15", "decode", 190.0, spread=[189.5, 190.5]),
        ],
        run_id="box-now",
    )
    assert advise(now).workloads[0].decision == CLEAR  # repeats alone: tight
    hist = history_runs([180.0, 200.0, 220.0, 205.0])
    w = advise(now, history=hist).workloads[0]
    assert w.best.noise.source == "history" and "larger than repeats" in w.best.noise.detail
    assert w.decision == WITHIN


def test_context_switch_threshold_and_the_run_that_would_place_it():
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", 280.0, spread=[278.0, 282.0]),
                meas(8, "ddtree:15", "decode", 260.0, spread=[258.0, 262.0]),
                meas(4, "ddtree:15", "long_context", 150.0, ctx=8000, out=256, spread=[149.0, 151.0]),
                meas(8, "ddtree:15", "long_context", 120.0, ctx=8000, out=256, spread=[119.0, 121.0]),
                meas(4, "ddtree:15", "long_context", 60.0, ctx=32000, out=256, spread=[59.0, 61.0]),
                meas(4, "ddtree:15", "long_context", 5.0, ctx=100000, out=256, spread=[4.9, 5.1]),
                meas(8, "ddtree:15", "long_context", 35.0, ctx=100000, out=256, spread=[34.5, 35.5]),
            ]
        )
    )
    assert [r.config.name for r in a.plan] == ["TP4 DDTree b15", "TP8 DDTree b15"]
    assert "context up to 8k tokens" in a.plan[0].when
    assert a.plan[1].when == "prompts of 100k tokens or more (the default still wins at 8k)"
    assert "TP8 DDTree b15 at 32k context not measured" in [g.text for g in a.gaps]


def test_concurrency_switch():
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", 280.0, spread=[279.0, 281.0]),
                meas(8, "ddtree:15", "decode", 260.0, spread=[259.0, 261.0]),
                meas(4, "ddtree:15", "concurrency", 1200.0, c=8, spread=[149.0, 151.0]),
                meas(8, "ddtree:15", "concurrency", 700.0, c=8, spread=[87.0, 88.0]),
                meas(4, "ddtree:15", "concurrency", 1500.0, c=32, spread=[46.0, 48.0]),
                meas(8, "ddtree:15", "concurrency", 2400.0, c=32, spread=[74.0, 76.0]),
            ]
        )
    )
    assert [(r.when, r.config.name) for r in a.plan][1] == ("concurrency C=32 or more", "TP8 DDTree b15")
    assert "concurrency C=8" in a.plan[0].when and a.exit_code == 0


def test_failed_and_skipped_runs_are_gaps_and_nothing_measured_is_no_plan():
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", None, status="failed", reason="server died: CUDA error 999"),
                meas(8, "ddtree:15", "decode", None, status="skipped", reason="box has 4 GPUs; TP8 needs 8"),
            ]
        )
    )
    assert a.plan == [] and not a.decided and a.exit_code == 1
    kinds = sorted(g.kind for g in a.gaps)
    assert kinds == ["failed", "skipped"]
    assert a.workloads[0].best is None and "not measured" in a.workloads[0].noise_text


# --- evidence from outside the result -----------------------------------------------------------


def probe_for_seed():
    """The synthetic 8-GPU PCIe probe fixture with the seed box's bus ids (same GPUs by index)."""
    p = json.loads((PROBE_FIX / "synthetic_8gpu_pcie.json").read_text())
    for g, f in zip(p["nvml"]["gpus"], json.loads(Path(AFTER).read_text())["facts"]["gpus"]):
        g["bus_id"] = "0000" + f["bus_id"]  # NVML's 8-digit domain: must still match
    return p


def test_probe_all_reduce_backs_the_numa_reason():
    p = probe_for_seed()
    bw = allreduce_busbw(p)
    assert bw[(0, 1, 2, 3)][0] == 36.2 and bw[(0, 1, 2, 3, 4, 5, 6, 7)][0] == 23.4
    w = by_id(advise(seed(), probe=p))["decode/out1024"]
    r = next(r for r in w.reasons if r.startswith("probe all-reduce"))
    assert "36.2 GB/s over GPUs 0-3 (TP4) vs 23.4 GB/s over GPUs 0-7 (TP8, -35%)" in r
    assert "TP8 (GPUs 0-7) spans NUMA nodes 0 and 1" in r


def test_probe_of_other_gpus_is_not_used():
    p = json.loads((PROBE_FIX / "synthetic_8gpu_pcie.json").read_text())  # bus ids differ from GPU 4 on
    a = advise(seed(), probe=p)
    assert not any(r.startswith("probe all-reduce") for w in a.workloads for r in w.reasons)
    assert any("GPU 4 is 98:00.0 in the run and 97:00.0 in the probe" in n for n in a.notes)


REAL_LOGS = FIX / "realworld"


def test_kv_cache_lines_from_real_vllm_logs():
    assert kv_cache((REAL_LOGS / "vllm_kv_tp4_issue21348.log").read_text()) == {
        "gib_per_gpu": 8.11,
        "tokens": 178880.0,
    }
    assert kv_cache((REAL_LOGS / "vllm_kv_pr13596.log").read_text()) == {"tokens": 2042016.0}
    assert kv_cache((REAL_LOGS / "vllm_kv_old_format_pr13596.log").read_text()) == {}


def test_server_log_kv_figures_back_the_long_context_reason(tmp_path):
    doc = json.loads(Path(AFTER).read_text())
    log = tmp_path / "tp8.log"
    log.write_text((REAL_LOGS / "vllm_kv_tp4_issue21348.log").read_text())
    for s in doc["servers"]:
        if s["tp"] == 8 and s["label"] == "ddtree:15":
            s["log"] = str(log)
        if s["tp"] == 4 and s["label"] == "ddtree:15":
            s["log"] = str(tmp_path / "absent.log")  # not on this machine: less evidence, no error
    run = from_doc(doc, "seed-logs.json", "seed-logs")
    logs = server_logs(run)
    assert (4, "ddtree:15") not in logs
    w = by_id(advise(run, logs=logs))["long_context/ctx100000/out256"]
    r = next(r for r in w.reasons if "shards the KV cache" in r)
    assert "TP8: 8.1 GiB KV cache per GPU, 178,880 KV tokens" in r and "TP4: 4 x 95.6 GiB GPUs" in r


# --- CLI and formats ----------------------------------------------------------------------------


def test_cli_text_json_and_exit_codes(capsys):
    rc, out, _ = gpubox(capsys, "advise", AFTER, "--no-history")
    assert rc == 0 and "Serving plan" in out and "TP4 DDTree b15" in out
    assert "2048-token outputs not measured" in " ".join(out.split())
    rc, out, _ = gpubox(capsys, "advise", AFTER, "--no-history", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["exit_code"] == 0
    plan = doc["advice"][0]["plan"]
    assert [r["config"]["name"] for r in plan] == ["TP4 DDTree b15", "TP8 DDTree b15"]
    c8 = next(w for w in doc["advice"][0]["workloads"] if w["id"] == "concurrency/c8/out1024")
    assert c8["exceeds_noise"] is True and c8["margin"] == pytest.approx(543.8)
    rc, out, _ = gpubox(capsys, "advise", PARTIAL, "--no-history", "--json")
    assert rc == 1 and json.loads(out)["advice"][0]["simulated"] is True


def test_cli_uses_the_box_history(capsys, tmp_path, monkeypatch):
    from gpubox.bench import history

    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    now = sim_run(
        [meas(4, "ddtree:15", "decode", 200.0, reps=1), meas(8, "ddtree:15", "decode", 190.0, reps=1)],
        run_id="box-now",
    )
    for d in history_runs([196.0, 204.0, 199.0, 201.0]):
        history.record(d, base=tmp_path / "state")
    f = tmp_path / "now.json"
    f.write_text(json.dumps(now.doc))
    rc, out, _ = gpubox(capsys, "advise", str(f), "--json")
    w = json.loads(out)["advice"][0]["workloads"][0]
    assert rc == 0 and w["noise_source"] == "history"
    rc, out, _ = gpubox(capsys, "advise", str(f), "--json", "--no-history")
    assert rc == 1 and json.loads(out)["advice"][0]["workloads"][0]["decision"] == "noise_unknown"


def test_formats_escape_text_from_documents(capsys, tmp_path):
    for fmt, needle, raw_absent in (
        ("md", r"ct\_200 \#1 {lab} 50% \& \$HOME \~x \^y \\z", True),
        ("html", "ct_200 #1 {lab} 50% &amp; $HOME ~x ^y \\z", True),
        (
            "latex",
            r"ct\_200 \#1 \{lab\} 50\% \& \$HOME \textasciitilde{}x \textasciicircum{}y \textbackslash{}z",
            True,
        ),
    ):
        out = tmp_path / f"a.{fmt}"
        rc, _, _ = gpubox(capsys, "advise", PARTIAL, "--no-history", "--format", fmt, "-o", str(out))
        text = out.read_text()
        assert rc == 1 and needle in text, fmt
        assert HOSTILE_BOX not in text or not raw_absent
        assert "cut by the context window" in text
    assert "\\VAR{" not in (tmp_path / "a.latex").read_text()


@pytest.mark.skipif(not HAVE_TEX, reason="latexmk/pdflatex or pdftotext not installed")
def test_latex_advice_compiles(capsys, tmp_path):
    from gpubox.bench.report.latex import compile_pdf

    tex = tmp_path / "advice.tex"
    rc, _, _ = gpubox(capsys, "advise", AFTER, PARTIAL, "--no-history", "--format", "latex", "-o", str(tex))
    assert rc == 1
    pdf = compile_pdf(tex)
    text = " ".join(
        subprocess.run(["pdftotext", "-raw", str(pdf), "-"], capture_output=True, text=True).stdout.split()
    )
    assert "TP4 DDTree b15" in text and "prompts of 25k tokens or more" in text and HOSTILE_BOX in text


def test_every_report_leads_with_the_advice(capsys, tmp_path):
    for fmt, main, head, first in (
        ("md", "report.md", "## Advice: which configuration to run", "## Summary of findings"),
        ("html", "report.html", "Advice: which configuration to run</h2>", "<h2>Summary of findings</h2>"),
        (
            "latex",
            "report.tex",
            r"\section*{Advice: which configuration to run}",
            r"\section*{Summary of findings}",
        ),
    ):
        out = tmp_path / fmt
        rc, _, _ = gpubox(capsys, "report", AFTER, "--format", fmt, "-o", str(out))
        text = (out / main).read_text()
        assert rc == 0 and head in text and text.index(head) < text.index(first), fmt
        assert "TP4 DDTree b15" in text[: text.index(first)]
    rc, out, _ = gpubox(capsys, "report", AFTER, "--format", "md", "-o", str(tmp_path / "j"), "--json")
    assert json.loads(out)["advice"][0]["plan"][0]["config"]["name"] == "TP4 DDTree b15"
    before = str(FIX / "seed-before.json")
    rc, out, _ = gpubox(
        capsys, "report", before, AFTER, "--compare", "--format", "md", "-o", str(tmp_path / "c"), "--json"
    )
    assert rc == 0 and [a["run"] for a in json.loads(out)["advice"]] == ["seed-after"]  # not the baseline


@pytest.mark.parametrize(
    "args,needle",
    [
        (["missing.json"], "no such file"),
        (["BAD"], "not valid JSON"),
        ([AFTER, "--probe", "BAD"], "not valid JSON"),
        ([AFTER, "--probe", AFTER], "not a probe document (schema 'gpubox.bench/1'"),
        ([AFTER, "-o", "x.md"], "add --format md, html or latex"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, tmp_path, args, needle):
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    argv = [
        str(bad) if a == "BAD" else (str(tmp_path / a) if a in ("missing.json", "x.md") else a) for a in args
    ]
    rc, _, err = gpubox(capsys, "advise", *argv, "--no-history")
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.md").exists()


def test_probe_inside_gpubox_probe_json_is_accepted(capsys):
    rc, out, _ = gpubox(
        capsys,
        "advise",
        AFTER,
        "--no-history",
        "--probe",
        str(PROBE_FIX / "h200_real_cli_report.json"),
        "--json",
    )
    # a real one-GPU H200 probe: accepted, but of other GPUs than the seed box, so not used
    assert rc == 0 and any("not used" in n for n in json.loads(out)["advice"][0]["notes"])


def test_advise_on_a_result_the_benchmark_really_wrote(tmp_path, capsys):
    """`gpubox bench` against the simulated box (real server processes, real client) writes the
    result; advise reads it as it is. The simulated box's inventory runs one repetition per point
    (gpubox/simbox/server.py, to stay fast), so there is no noise estimate: the advice must say so
    and not decide. Which TP wins depends on this
    machine's load, so the winner is not asserted."""
    from gpubox.simbox import build

    sim = build(tmp_path / "box")
    rc, out, _ = gpubox(
        capsys, "-i", sim.inventory_path, "bench", "ct200", "--tp", "4,8", "--methods", "ddtree:15",
        "--out", tmp_path / "out", "--json",
    )  # fmt: skip
    doc = json.loads(out)
    path = tmp_path / "out" / f"{doc['run_id']}.json"
    rc, out, _ = gpubox(capsys, "advise", str(path), "--no-history", "--json")
    a = json.loads(out)["advice"][0]
    assert rc == 1 and a["simulated"] is True and a["decided"] is False
    ids = [w["id"] for w in a["workloads"]]
    assert ids == ["decode/out1024", "concurrency/c8"]
    for w in a["workloads"]:
        assert {p["config"]["name"] for p in w["ranking"]} == {"TP4 DDTree b15", "TP8 DDTree b15"}
        assert w["decision"] == "noise_unknown" and w["exceeds_noise"] is None
        assert "1 repetition" in w["best"]["noise"]["detail"]
    assert a["plan"][0]["config"]["name"] in ("TP4 DDTree b15", "TP8 DDTree b15")
    assert any(g["kind"] == "noise_unknown" for g in a["gaps"])


def test_plan_rows_never_overlap_when_the_winner_changes_back():
    """TP8 wins at 25k context and TP4 (the default) again at 100k: each context is in one row, never
    "context up to 100k -> TP4" beside "prompts of 25k or more -> TP8"."""
    a = advise(
        sim_run(
            [
                meas(4, "ddtree:15", "decode", 280.0, spread=[278.0, 282.0]),
                meas(8, "ddtree:15", "decode", 260.0, spread=[258.0, 262.0]),
                meas(4, "ddtree:15", "long_context", 40.0, ctx=25000, out=256, spread=[39.5, 40.5]),
                meas(8, "ddtree:15", "long_context", 90.0, ctx=25000, out=256, spread=[89.5, 90.5]),
                meas(4, "ddtree:15", "long_context", 30.0, ctx=100000, out=256, spread=[29.5, 30.5]),
                meas(8, "ddtree:15", "long_context", 10.0, ctx=100000, out=256, spread=[9.5, 10.5]),
            ]
        )
    )
    default, switch = a.plan
    assert default.config.name == "TP4 DDTree b15" and switch.config.name == "TP8 DDTree b15"
    assert "up to" not in default.when and "context of 100k tokens" in default.when
    assert switch.when == "prompts of 25k tokens (the default wins again at 100k)"
    rows = [set(r.workloads) for r in a.plan]
    assert not rows[0] & rows[1]
