"""A typed result: hostile result documents and history lines, through `gpubox report`, `gpubox
history`, `schedule run-once --from-json` and the Prometheus export. Each is refused with one line
naming the file and the field (exit 2), or skipped and said (history), never an internal error;
text reaches the terminal escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clirun import gpubox

FIX = Path(__file__).resolve().parents[1] / "fixtures"
AFTER = FIX / "results" / "seed-after.json"


def _doc() -> dict:
    return json.loads(AFTER.read_text())


def _m(doc, **kw):
    doc["measurements"][0].update(kw)
    return doc


# (id, raw JSON text, field the error must name)
def _cases():
    out = []
    d = json.dumps(_doc())
    out.append(
        ("nan", d.replace('"tok_s": ' + str(_doc()["measurements"][0]["tok_s"]), '"tok_s": NaN', 1), "tok_s")
    )
    out.append(
        (
            "infinity",
            d.replace('"tok_s": ' + str(_doc()["measurements"][0]["tok_s"]), '"tok_s": Infinity', 1),
            "tok_s",
        )
    )
    out.append(("tok_s-string", json.dumps(_m(_doc(), tok_s="fast")), "measurements[0].tok_s"))
    out.append(("label-list", json.dumps(_m(_doc(), label=["a", "b"])), "measurements[0].label"))
    out.append(("tp-bool", json.dumps(_m(_doc(), tp=True)), "measurements[0].tp"))
    out.append(("status-markup", json.dumps(_m(_doc(), status="[/]")), "measurements[0].status"))
    v = _doc()
    v["verdict"]["status"] = "[bold red]healthy[/]"
    out.append(("verdict-markup", json.dumps(v), "verdict.status"))
    out.append(("huge-int", d.replace('"tp": 1', '"tp": ' + "9" * 5000, 1), "integer with 5000 digits"))
    deep = _doc()
    deep["facts"]["x"] = json.loads("[" * 50 + "]" * 50)
    out.append(("deep-facts", json.dumps(deep), "nested deeper"))
    out.append(
        ("deep-100k", '{"schema": "gpubox.bench/1", "facts": ' + "[" * 100000 + "]" * 100000 + "}", "nested")
    )
    fut = _doc()
    fut["schema"] = "gpubox.bench/2"
    out.append(("future-version", json.dumps(fut), "newer"))
    out.append(
        (
            "reasons-not-list",
            json.dumps({**_doc(), "verdict": {"status": "healthy", "reasons": "x"}}),
            "reasons",
        )
    )
    out.append(("servers-dict", json.dumps({**_doc(), "servers": {"tp": 1}}), "servers"))
    out.append(("top-list", "[1]", "top level"))
    out.append(("measurement-null", json.dumps({**_doc(), "measurements": [None]}), "measurements[0]"))
    return out


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_report_names_file_and_field(tmp_path, capsys, case):
    name, text, field = case
    f = tmp_path / f"{name}.json"
    f.write_text(text)
    rc, out, err = gpubox(capsys, "report", f, "--format", "md", "-o", tmp_path / "out")
    assert rc == 2, out + err
    assert "internal error" not in err and "Traceback" not in err, err
    assert str(f) in err and field in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_history_skips_and_says_never_lists(tmp_path, capsys, case):
    from gpubox.bench import history

    name, text, field = case
    good = _doc()
    history.record(good)
    path = history.store_path(good["box"])
    bad = '{"history": "gpubox.history/1", "recorded_at": "x", "doc": ' + text + "}"
    with open(path, "a") as f:
        f.write(bad + "\n")
    rc, out, err = gpubox(capsys, "history", good["box"], "--json")
    assert "internal error" not in err and "Traceback" not in err, err
    assert rc == 0, err
    runs = json.loads(out)["runs"]
    assert [r["run_id"] for r in runs] == [good["run_id"]], "DAMAGE: a damaged line is listed as a run"
    if name not in ("top-list", "deep-100k"):
        assert "skipped" in err and f"{path}:2" in err, err


@pytest.mark.parametrize("case", CASES[:8], ids=[c[0] for c in CASES[:8]])
def test_run_once_from_json_refuses_naming_the_field(tmp_path, capsys, case):
    from gpubox.simbox import build

    name, text, field = case
    sim = build(tmp_path / "box")
    f = tmp_path / f"{name}.json"
    doc_text = text.replace('"box": "ct200"', '"box": "ct200"')
    f.write_text(doc_text)
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "schedule", "run-once", "ct200", "--no-doctor", "--from-json", f
    )
    assert rc == 2 and str(f) in err and field in err and "internal error" not in err, err
    assert not sim.cpath("/var/lib/prometheus/node-exporter/gpubox_ct200.prom").exists()


def test_escape_sequences_in_a_stored_reason_reach_no_terminal(tmp_path, capsys):
    from gpubox.bench import history

    doc = _doc()
    doc["verdict"] = {
        "status": "degraded",
        "reasons": [{"level": "degraded", "message": "\x1b]0;owned\x07\x1b[2J"}],
    }
    doc["measurements"][0]["label"] = "\x1b[31mred\x9b1m"
    history.record(doc)
    rc, out, err = gpubox(capsys, "history", doc["box"])
    assert rc == 0, err
    assert not any(c in out + err for c in "\x1b\x07\x9b"), repr(out)
