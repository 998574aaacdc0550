"""Prometheus textfile output: parses with prometheus_client, one HELP/TYPE per metric, atomic write."""

import json
import re
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpubox.bench import prom, regress
from gpubox.host import Host
from gpubox.inventory import HostEntry
from gpubox.pipeline import run_steps
from gpubox.steps import Finding, Step
from gpubox.transport.local import LocalTransport

FIX = Path(__file__).parent / "fixtures" / "history"


def load(n):
    return json.loads((FIX / f"run{n:02d}.json").read_text())


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def assert_one_help_type_each(text):
    helps = Counter(re.findall(r"^# HELP (\S+) ", text, re.M))
    types = Counter(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert helps and set(helps) == set(types)
    assert max(helps.values()) == 1 and max(types.values()) == 1, (helps, types)
    for name in re.findall(r"^([a-z_]+)\{", text, re.M):
        assert name in types, f"sample {name} without TYPE"


def test_healthy_run_metrics():
    text = prom.render(regress.with_verdict(load(1)))
    assert_one_help_type_each(text)
    f = families(text)
    assert f["gpubox_health"].samples[0].value == 0
    assert f["gpubox_health"].samples[0].labels == {"box": "ct200"}
    assert f["gpubox_last_run_timestamp_seconds"].samples[0].value == 1793491452  # 2026-11-01T00:04:12Z
    assert f["gpubox_last_run_duration_seconds"].samples[0].value == 252
    tok = {(s.labels["tp"], s.labels["label"]): s.value for s in f["gpubox_bench_tokens_per_second"].samples}
    assert tok == {
        ("1", "auto"): 26.6,
        ("1", "ddtree:15"): 173.4,
        ("4", "auto"): 37.8,
        ("4", "ddtree:15"): 281.1,
        ("8", "auto"): 37.6,
        ("8", "ddtree:15"): 263.9,
    }
    s = f["gpubox_bench_tokens_per_second"].samples[0]
    assert set(s.labels) == set(prom.M_LABELS) and s.labels["workload"] == "decode"
    acc = {s.labels["label"] for s in f["gpubox_acceptance_length"].samples}
    assert acc == {"ddtree:15"}, "auto has no acceptance counters: no sample, not a zero"
    assert "gpubox_step_ok" not in f


def test_degraded_and_failed_levels_and_no_zero_for_failed_measurements():
    f = families(
        prom.render(regress.with_verdict(load(7), [], regress.Settings(expect={"tp8": {"ddtree:15": 263.9}})))
    )
    assert f["gpubox_health"].samples[0].value == 1
    f = families(prom.render(regress.with_verdict(load(12))))
    assert f["gpubox_health"].samples[0].value == 2
    tok_keys = {s.labels["key"] for s in f["gpubox_bench_tokens_per_second"].samples}
    assert not any(k.startswith("tp8/") for k in tok_keys)
    ok = {s.labels["key"]: s.value for s in f["gpubox_bench_measurement_ok"].samples}
    assert ok["tp8/ddtree:15/decode/out1024"] == 0 and ok["tp1/auto/decode/out1024"] == 1


def test_concurrency_measurement_exports_aggregate():
    doc = load(1)
    doc["measurements"].append(
        {
            "key": "tp4/ddtree:15/concurrency/c8",
            "tp": 4,
            "method": "ddtree",
            "budget": 15,
            "label": "ddtree:15",
            "workload": "concurrency",
            "output_len": 1024,
            "concurrency": 8,
            "status": "ok",
            "tok_s": 158.8,
            "aggregate_tok_s": 1270.8,
            "acceptance": None,
        }
    )
    text = prom.render(doc)
    assert_one_help_type_each(text)
    agg = families(text)["gpubox_bench_aggregate_tokens_per_second"].samples
    assert [(s.labels["concurrency"], s.value) for s in agg] == [("8", 1270.8)]


class _Probe(Step):
    def __init__(self, name, finding):
        self.name, self.finding, self.where = name, finding, "container"

    def check(self, ctx):
        return self.finding


def test_doctor_step_findings_from_a_run_report():
    class Ctx:
        box = type(
            "B", (), {"name": "ct200", "container": HostEntry("ct200", {}), "host": HostEntry("pve1", {})}
        )()

    report = run_steps(
        Ctx(),
        [
            _Probe("cuda", Finding.ok("cuInit 0")),
            _Probe("nccl-env", Finding.drift("NCCL_PROTO misspelled")),
            _Probe("model-stage", Finding.failed("source missing")),
        ],
        "check",
    )
    text = prom.render(regress.with_verdict(load(1)), report.to_dict())
    assert_one_help_type_each(text)
    steps = {s.labels["step"]: s.value for s in families(text)["gpubox_step_ok"].samples}
    assert steps == {"cuda": 1, "nccl-env": 0, "model-stage": 0}
    only_doctor = families(prom.render(None, report.to_dict()))
    assert set(only_doctor) == {"gpubox_step_ok"}


def test_label_values_are_escaped():
    doc = load(1)
    doc["measurements"][0]["label"] = 'odd"label\\x\n'
    f = families(prom.render(doc))
    assert 'odd"label\\x\n' in {s.labels["label"] for s in f["gpubox_bench_tokens_per_second"].samples}


def test_write_is_atomic_under_the_root_prefix(tmp_path):
    root = tmp_path / "ct"
    host = Host(HostEntry("ct200", {"gpubox_root": str(root)}), LocalTransport("ct200"))
    path = prom.write(host, "ct200", prom.render(load(1)))
    assert path == "/var/lib/prometheus/node-exporter/gpubox_ct200.prom"
    real = root / path.lstrip("/")
    first = real.read_text()
    assert families(first)["gpubox_health"].samples[0].value == 0
    ino = real.stat().st_ino
    prom.write(host, "ct200", prom.render(load(12)))
    assert real.stat().st_ino != ino, "replaced by rename, not rewritten in place"
    assert families(real.read_text())["gpubox_health"].samples[0].value == 2
    assert sorted(p.name for p in real.parent.iterdir()) == ["gpubox_ct200.prom"]
    assert oct(real.stat().st_mode & 0o777) == "0o644"
