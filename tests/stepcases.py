"""Data-only step tests: `tests/steps/<step>/<case>.json` gives a step's facts and options, and the
finding (and plan) its pure `decide` must return. No host, no simulated box.

A case file:
    {"step": "gpubox.hwtune.numa_balancing_step:NumaBalancingStep",    # module:class
     "why": "one line: what this case pins down",
     "facts": {...}, "options": {...},                   # the step's Facts / Options dataclasses
     "expect": {"status": "drift", "detail": "...", "cause": ..., "repair": ..., "evidence": {...},
                "plan": {"description": "...", "commands": [[...]], "diff": "...", "writes": ["/path"]}}}
Keys left out of "expect" are not compared. Paths inside argv lists show without a root prefix.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any

from gpubox.pipeline import run_step  # noqa: F401  (the engine these decisions feed)
from gpubox.steps import Remove, Write, evidence_dict

ROOT = Path(__file__).parent / "steps"


def case_files() -> list[Path]:
    return sorted(ROOT.glob("*/*.json"))


def load_step(ref: str):
    mod, cls = ref.split(":")
    return getattr(importlib.import_module(mod), cls)


def from_json(tp: Any, data: Any) -> Any:
    """Build a value of type `tp` (dataclasses, lists, dicts, tuples, optionals) from JSON data."""
    origin = typing.get_origin(tp)
    if data is None:
        return None
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        unknown = set(data) - {f.name for f in dataclasses.fields(tp)}
        if unknown:
            raise KeyError(f"{tp.__name__} has no field(s) {sorted(unknown)}")
        return tp(**{k: from_json(hints[k], v) for k, v in data.items()})
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        for a in args:
            if dataclasses.is_dataclass(a) and isinstance(data, dict):
                return from_json(a, data)
        return from_json(args[0], data) if len(args) == 1 else data
    if origin in (list, typing.List):
        (item,) = typing.get_args(tp) or (Any,)
        return [from_json(item, x) for x in data]
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], x) for x in data)
        return tuple(from_json(a, x) for a, x in zip(args, data)) if args else tuple(data)
    if origin in (dict, typing.Dict):
        kt, vt = typing.get_args(tp) or (Any, Any)
        return {k: from_json(vt, v) for k, v in data.items()}
    return data


class _PlainHost:
    """Resolves HostPath without a root prefix, so cases show the logical paths."""

    name = "case"

    @staticmethod
    def path(p: str) -> str:
        return p


def run_case(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(actual, expected) for one case, with only the keys the case names."""
    case = json.loads(path.read_text())
    cls = load_step(case["step"])
    step = cls(**case.get("init", {}))
    hints = typing.get_type_hints(cls.decide)
    facts_arg, opts_arg = list(inspect.signature(cls.decide).parameters)[1:3]
    facts = from_json(hints[facts_arg], case["facts"])
    opts = from_json(hints[opts_arg], case.get("options", {}))
    f = step.decide(facts, opts)
    got: dict[str, Any] = {
        "status": f.status,
        "detail": f.detail,
        "cause": f.cause,
        "repair": f.repair,
        "evidence": json.loads(json.dumps(evidence_dict(f.evidence))),
    }
    if f.plan is not None:
        p = f.plan
        got["plan"] = {
            "description": p.description,
            "diff": p.diff,
            "commands": p.shown_commands(lambda where: _PlainHost),
            "writes": [a.path for a in p.actions if isinstance(a, Write)],
            "removes": [a.path for a in p.actions if isinstance(a, Remove)],
        }
    want = case["expect"]
    got = {k: v for k, v in got.items() if k in want}
    if "plan" in want and "plan" in got:
        got["plan"] = {k: v for k, v in got["plan"].items() if k in want["plan"]}
    return got, want
