"""The probe document's model (hwtune/probe_doc.py): every recorded document loads and writes back
key for key; a field of the wrong type is one line naming it, at the CLI exit 2 with nothing
judged."""

import copy
import json
from pathlib import Path

import pytest

from gpubox.errors import GpuboxError
from gpubox.hwtune.probe_doc import ProbeDoc, parse
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "probe"
RECORDED = sorted(
    p for p in FIX.rglob("*.json") if json.loads(p.read_text()).get("schema") == "gpubox.probe/1"
)


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(FIX)))
def test_every_recorded_document_writes_back_as_it_was_read(path):
    raw = json.loads(path.read_text())
    doc = ProbeDoc.from_json(raw)
    assert json.dumps(doc.to_json()) == json.dumps(raw)
    assert len(doc.gpus) == len(raw["nvml"].get("gpus") or [])


def test_typed_fields_and_lookups():
    doc = parse((FIX / "h200x2_nvswitch" / "probe.json").read_text())
    g0 = doc.gpus[0]
    assert g0.pcie.gen_max == 5 and g0.nvlink is not None and g0.nvlink.links[0].remote_type == "switch"
    assert doc.gpu_of(1) is doc.gpus[1] and doc.bus_of(1) == doc.gpus[1].bus_id
    p2p = [p for p in doc.probes if p.name == "p2p"]
    assert p2p and all(p.gbps and p.gbps > 300 for p in p2p)


def test_keys_the_model_does_not_know_are_kept_in_place():
    raw = load("h200_real.json")
    raw["nvml"]["gpus"][0] = {"vendor_note": "x", **raw["nvml"]["gpus"][0]}
    raw["later_field"] = [1, 2]
    back = ProbeDoc.from_json(copy.deepcopy(raw)).to_json()
    assert json.dumps(back) == json.dumps(raw)


@pytest.mark.parametrize(
    "where, value, words",
    [
        (
            ("nvml", "gpus", 0, "pcie", "gen_max"),
            "5",
            'probe document: nvml.gpus[0].pcie.gen_max is "5", not an integer',
        ),
        (("nvml", "gpus", 0, "persistence_mode"), 1, "persistence_mode is 1, not true or false"),
        (("nvml", "gpus"), {"0": {}}, "probe document: nvml.gpus is"),
        (("bandwidth", "probes", 0, "gbps"), None, "probes[0] (h2d) is ok but has no gbps"),
        (("xid", "events"), [7], "probe document: xid.events[0] is 7, not a JSON object"),
    ],
)
def test_a_wrong_field_is_one_line_naming_it(where, value, words):
    raw = load("h200_real.json")
    node = raw
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    with pytest.raises(GpuboxError) as e:
        ProbeDoc.from_json(raw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_cli_refuses_a_malformed_document_in_one_line(capsys, tmp_path):
    raw = load("h200_real.json")
    raw["nvml"]["gpus"][0]["pcie"]["width_max"] = "x16"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    rc, out, err = gpubox(capsys, "probe", "--input", str(bad))
    assert (
        rc == 2
        and f'{bad}: nvml.gpus[0].pcie.width_max is "x16", not an integer' in err
        and len(err.strip().splitlines()) == 1
        and out == ""
    )
