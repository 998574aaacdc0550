"""The corpus of real GPU-box failures (issue 28): tests/fixtures/failures/realworld/*.json.

Each case is a public report -- its address and date, the symptoms as posted, the cause the thread
established -- turned into the facts one of gpubox's steps reads, and the finding gpubox must give:
the status, words the detail must carry (detected), the cause named, the repair or refusal named,
and whether a plan repairs it ("repaired": the plan's commands) or the operator is told what to do
("refused": no plan, a repair text) or nothing is wrong ("none": no alarm). The steps' PURE
decisions run on each (no host, no simulated box): facts in, finding out.

Probe cases start from the recorded real H200 probe document and set only what the report shows
(`doc_patch`, dotted paths); `facts_note` says what a case had to assume beyond the post.
"""

from __future__ import annotations

import copy
import inspect
import json
import typing
from pathlib import Path

import pytest

from tests.stepcases import from_json, load_step

REPO = Path(__file__).resolve().parent.parent
ROOT = REPO / "tests" / "fixtures" / "failures" / "realworld"
CASES = sorted(ROOT.glob("*.json"))
CLASSES = {
    "gpu-count",
    "kernel-module",
    "optional-node",
    "toolkit-in-lxc",
    "shm-room",
    "pcie-link",
    "power",
    "fabric",
    "acs",
    "cdi-spec",
    "package-drift",
    "kernel-log",
}


def _set(doc, dotted: str, value) -> None:
    keys = dotted.split(".")
    cur = doc
    for k in keys[:-1]:
        cur = cur[int(k)] if isinstance(cur, list) else cur.setdefault(k, {})
    last = keys[-1]
    if isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value


def facts_of(case: dict) -> dict:
    facts = copy.deepcopy(case["facts"])
    if "doc_base" in case:
        doc = json.loads((REPO / case["doc_base"]).read_text())
        for k, v in case.get("doc_patch", {}).items():
            _set(doc, k, v)
        facts["doc"] = doc
    return facts


def decide(case: dict):
    cls = load_step(case["step"])
    hints = typing.get_type_hints(cls.decide)
    facts_arg, opts_arg = list(inspect.signature(cls.decide).parameters)[1:3]
    facts = from_json(hints[facts_arg], facts_of(case))
    opts = from_json(hints[opts_arg], case.get("options", {}))
    return cls().decide(facts, opts)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_is_documented(path):
    case = json.loads(path.read_text())
    assert case["source"].startswith("https://"), "each case names its public source"
    assert case["reported"][:2] in ("20",) and case["symptoms"] and case["established_cause"]
    assert case["class"] in CLASSES
    assert case["finding"]["outcome"] in ("repaired", "refused", "none")


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_gpubox_gives_the_finding(path):
    case = json.loads(path.read_text())
    want = case["finding"]
    f = decide(case)
    assert f.status == want["status"], (f.status, f.detail, f.cause)
    for word in want.get("detected", []):
        assert word in f.detail, f"{word!r} not in detail: {f.detail}"
    for word in want.get("cause", []):
        assert word in (f.cause or "") + " " + f.detail, f"{word!r} not in cause: {f.cause}"
    for word in want.get("repair", []):
        assert word in (f.repair or ""), f"{word!r} not in repair: {f.repair}"
    if want["outcome"] == "repaired":
        assert f.plan is not None and f.plan.actions, "a repair must come as a plan"
        shown = [[str(a) for a in c] for c in f.plan.shown_commands(lambda where: _Plain)]
        for argv in want.get("commands", []):
            assert argv in shown, (argv, shown)
    elif want["outcome"] == "refused":
        assert f.status in ("failed", "drift") and not (f.plan and f.plan.actions) and f.repair
    else:
        assert f.status == "ok"


class _Plain:
    name = "case"

    @staticmethod
    def path(p: str) -> str:
        return p


def test_corpus_size_and_coverage():
    cases = [json.loads(p.read_text()) for p in CASES]
    assert len(cases) >= 30
    assert {c["class"] for c in cases} == CLASSES
    assert len({c["source"] for c in cases}) >= 30  # distinct public reports
