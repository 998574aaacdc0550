"""The typed document models (bench.result_model, gpubox.docmodel): every recorded document reads
and writes back byte for byte, a bad one is one line naming the field (exit 2), and what the
models declare is what docs/result-schema.md says."""

import json
from pathlib import Path

import pytest

from gpubox.bench import history, results
from gpubox.bench.result_model import BenchResult, HistoryRecord, Measurement, Verdict
from gpubox.bench.schema import ResultError
from gpubox.errors import GpuboxError

TESTS = Path(__file__).parent
RECORDED = sorted(
    p
    for d in (TESTS / "fixtures", TESTS / "data")
    for p in d.rglob("*.json")
    if '"gpubox.bench/1"' in p.read_text(encoding="utf-8", errors="replace")[:200]
)


def test_the_recorded_documents_are_found():
    names = {p.name for p in RECORDED}
    assert {"bench_result_sim.json", "partial.json", "seed-before.json", "run01.json"} <= names


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(TESTS)))
def test_recorded_document_round_trips_byte_for_byte(path):
    text = path.read_text(encoding="utf-8")
    got = BenchResult.from_json(text, str(path)).to_json()
    # gpubox writes a final newline; one fixture was saved without it
    assert got == (text if text.endswith("\n") else text + "\n")


def test_unknown_keys_keep_their_place_and_value():
    text = (TESTS / "fixtures" / "results" / "partial.json").read_text()
    doc = BenchResult.from_json(text)
    assert list(doc.to_dict()) == list(json.loads(text))
    assert doc.get("some_future_key") == json.loads(text)["some_future_key"]


def test_readers_get_typed_fields():
    doc = BenchResult.load(TESTS / "data" / "bench_result_sim.json")
    m = doc.measurements[0]
    assert isinstance(m, Measurement) and isinstance(doc.verdict, Verdict)
    assert m.key.startswith(f"tp{m.tp}/") and m.workload in (
        "decode",
        "concurrency",
        "long_context",
        "agentic",
    )
    assert doc.facts.gpu_list()[0].index == 0
    assert all(s.ttft_s is None or s.ttft_s >= 0 for s in m.samples)


def test_history_line_round_trips_and_is_what_record_writes():
    for n in (1, 2):
        history.record(json.loads((TESTS / "fixtures" / "history" / f"run{n:02d}.json").read_text()))
    store = history.store_path("ct200")
    lines = store.read_text().splitlines()
    assert len(lines) == 2
    for i, line in enumerate(lines, 1):
        rec = HistoryRecord.from_line(line, f"{store}:{i}")
        assert rec.to_json() == line
        assert all(m.samples is None for m in rec.doc.measurements), "history keeps no raw samples"


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda d: d["measurements"][0].update(tp=0),
            "measurements[0].tp: a number (0), expected a whole number >= 1",
        ),
        (
            lambda d: d["measurements"][0].update(workload="chat"),
            "measurements[0].workload: 'chat' is not one of",
        ),
        (lambda d: d["verdict"].update(status="fine"), "verdict.status: 'fine' is not one of healthy"),
        (lambda d: d["servers"][0].update(command="vllm"), "servers[0].command: a string, expected a list"),
        (
            lambda d: d.update(schema="gpubox.bench/2"),
            "schema: gpubox.bench/2 is newer than this gpubox reads",
        ),
        (lambda d: d.pop("run_id"), "run_id: missing"),
        (
            lambda d: d["measurements"][0]["samples"][0].update(ttft_s=float("nan")),
            "measurements[0].samples[0].ttft_s: NaN is not a finite number",
        ),
    ],
)
def test_a_bad_document_is_one_line_naming_the_field(tmp_path, edit, message):
    doc = json.loads((TESTS / "data" / "bench_result_sim.json").read_text())
    edit(doc)
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ResultError) as exc:
        BenchResult.load(p)
    assert str(exc.value.problem).startswith(f"{p}: {message}")
    assert "\n" not in exc.value.problem and exc.value.exit_code == 2
    assert isinstance(exc.value, GpuboxError)


def test_the_writer_writes_what_the_model_reads(tmp_path):
    text = (TESTS / "data" / "bench_result_sim.json").read_text()
    path = results.write(json.loads(text), tmp_path)
    assert path.read_text() == BenchResult.from_json(text).to_json()


def test_the_schema_page_is_what_the_models_generate():
    from gpubox.bench import schema_doc

    page = TESTS.parent / "docs" / "result-schema.md"
    assert page.read_text(encoding="utf-8") == schema_doc.render(), "run `python -m gpubox.bench.schema_doc`"
    assert schema_doc.main(["--check"]) == 0
    for field in ("`repairs`", "`topology_source`", "`prompt_tokens`", "`clock`", "`box_id`"):
        assert field in page.read_text(encoding="utf-8")


def _advice_text(path):
    from gpubox.bench.report.advice import advise_all
    from gpubox.bench.report.data import load_run

    advices = advise_all([load_run(path)])
    rc = max(a.exit_code for a in advices)
    # what `gpubox advise --json` prints (gpubox.output.print_json)
    return advices, json.dumps({"advice": [a.to_dict() for a in advices], "exit_code": rc}, indent=2) + "\n"


@pytest.mark.parametrize("name", ["seed-before.json", "seed-after.json", "partial.json"])
def test_advice_document_round_trips_and_is_what_advise_prints(name):
    from gpubox.bench.report.advice_doc import AdviceDocument

    advices, text = _advice_text(TESTS / "fixtures" / "results" / name)
    assert AdviceDocument(advices).to_json() == text
    doc = AdviceDocument.from_json(text, name)
    assert doc.to_json() == text
    assert [a.run for a in doc.advice] == [a.run for a in advices]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["advice"][0].update(exit_code=7), "advice[0].exit_code: 7 does not follow"),
        (
            lambda d: d["advice"][0]["workloads"][0].update(decision="maybe"),
            "advice[0].workloads[0].decision:",
        ),
        (
            lambda d: d["advice"][0]["workloads"][0]["ranking"][0].pop("key"),
            "advice[0].workloads[0].ranking[0].key: missing",
        ),
        (
            lambda d: d["advice"][0]["workloads"][0]["ranking"][0]["config"].update(tp="8"),
            "ranking[0].config.tp: a string",
        ),
    ],
)
def test_a_bad_advice_document_is_one_line_naming_the_field(edit, message):
    from gpubox.bench.report.advice_doc import AdviceDocument, AdviceError

    _, text = _advice_text(TESTS / "fixtures" / "results" / "seed-before.json")
    d = json.loads(text)
    edit(d)
    with pytest.raises(AdviceError) as exc:
        AdviceDocument.from_json(json.dumps(d), "a.json")
    assert exc.value.problem.startswith("a.json: ") and message in exc.value.problem
    assert exc.value.exit_code == 2 and "\n" not in str(exc.value)


def test_verdict_reads_and_writes_on_its_own():
    d = json.loads((TESTS / "fixtures" / "history" / "run01.json").read_text())
    text = json.dumps(d["verdict"], indent=1) + "\n"
    v = Verdict.from_json(text, "verdict.json")
    assert v.to_json() == text and v.status == d["verdict"]["status"]
    with pytest.raises(ResultError, match=r"^verdict.json: status: 'fine' is not one of"):
        Verdict.from_json('{"status": "fine", "reasons": []}', "verdict.json")
