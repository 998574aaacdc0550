"""Typed JSON documents: one dataclass per document shape, checked when it is read and written
back key for key (GuideLLM's benchmark/schemas/report.py writes, validates and reads its report
through one schema class; this is the same idea without a pydantic dependency).

A model is a dataclass whose fields carry a `spec` (what the JSON value must be) and a `doc` line
(what it means; docs/result-schema.md is generated from both, gpubox.bench.schema_doc). Reading
(`Model.from_dict(value, path)`) checks every declared field it finds and raises `Problem` with
the first one, as `<field path>: <what is wrong>`; the document's own module turns that into its
one-line error (exit 2). Keys the model does not declare are kept as they are, and the order of
the keys read is remembered, so `from_dict(x).to_dict() == x` key order included: a reader never
rewrites a document it did not mean to change.

A spec is a type name ("str", "bool", "int", "posint", "number", "pos" (> 0), "nonneg" (>= 0),
"any"; a trailing "?" allows null; pos and nonneg are at most MAX_FIGURE), or ("enum", values),
("list", inner), ("map", None) for a free object, ("model", Class) for a nested model; a "?"
after the kind ("list?", "model?", "map?") allows null.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, TypeVar

M = TypeVar("M", bound="Model")

MAX_FIGURE = 1e12  # tok/s, seconds, milliseconds: far above any real figure, far below overflow
WORDS = {
    "str": "a string",
    "bool": "true or false",
    "int": "a whole number",
    "posint": "a whole number >= 1",
    "number": "a finite number",
    "pos": f"a number > 0 and <= {MAX_FIGURE:g}",  # a rate or length that is divided by
    "nonneg": f"a number >= 0 and <= {MAX_FIGURE:g}",  # a duration or a fraction
}


def figure(v: Any) -> bool:
    """A number from a document that arithmetic may use (checked for its range by the caller)."""
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and (not isinstance(v, float) or math.isfinite(v))
    )


class Problem(ValueError):
    """The first way a value breaks its model: `<field path>: <what is wrong>`."""


def spec(kind: Any, doc: str = "", *, shape: Any = None, default: Any = None, checked: bool = False) -> Any:
    """A model field: KIND checked on read, DOC and SHAPE (the type as the docs say it, where the
    check is looser than the shape, e.g. free-form facts) documented; absent reads as DEFAULT.
    CHECKED: an `any` field that the model's own from_dict checks (documented as checked)."""
    meta = {"spec": kind, "doc": doc, "shape": shape, "checked": checked or kind != "any"}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def where(path: str) -> str:
    return path or "(document)"


def join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def kind_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def const(v: float) -> str:
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def short(v: Any) -> str:
    from gpubox.escape import terminal

    return terminal(repr(v), limit=40)


def bounded(v: Any, path: str, max_depth: int, max_int: int, max_str: int, depth: int = 0) -> str | None:
    """Depth, size and finiteness of any JSON value, declared or not (None when within bounds)."""
    if depth > max_depth:
        return f"{where(path)}: nested deeper than {max_depth} levels"
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return None if abs(v) <= max_int else f"{where(path)}: integer with {len(str(abs(v)))} digits"
    if isinstance(v, float):
        return None if math.isfinite(v) else f"{where(path)}: {const(v)} is not a finite number"
    if isinstance(v, str):
        return None if len(v) <= max_str else f"{where(path)}: a string of {len(v)} characters"
    if isinstance(v, list):
        for i, x in enumerate(v):
            p = bounded(x, f"{path}[{i}]", max_depth, max_int, max_str, depth + 1)
            if p:
                return p
        return None
    if isinstance(v, dict):
        for k, x in v.items():
            p = bounded(x, join(path, k), max_depth, max_int, max_str, depth + 1)
            if p:
                return p
        return None
    return f"{where(path)}: {type(v).__name__} is not JSON"


def _scalar(v: Any, sp: str, path: str) -> Any:
    t = sp.rstrip("?")
    if t == "any":
        return v
    if v is None:
        if sp.endswith("?"):
            return None
        raise Problem(f"{where(path)}: null, expected {WORDS[t]}")
    ok = {
        "str": isinstance(v, str),
        "bool": isinstance(v, bool),
        "int": isinstance(v, int) and not isinstance(v, bool),
        "posint": isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "number": isinstance(v, (int, float)) and not isinstance(v, bool),
        "pos": figure(v) and 0 < v <= MAX_FIGURE,
        "nonneg": figure(v) and 0 <= v <= MAX_FIGURE,
    }[t]
    if t in ("number", "pos", "nonneg") and isinstance(v, float) and not math.isfinite(v):
        raise Problem(f"{where(path)}: {const(v)} is not a finite number")
    if not ok and t in ("pos", "nonneg") and figure(v):  # a number out of range: say which bound
        raise Problem(f"{where(path)}: {short(v)} is not {WORDS[t]}")
    if not ok:
        raise Problem(f"{where(path)}: {kind_of(v)} ({short(v)}), expected {WORDS[t]}")
    return v


def convert(v: Any, sp: Any, path: str) -> Any:
    """V checked against SP; nested models built. Raises Problem naming PATH."""
    if isinstance(sp, str):
        return _scalar(v, sp, path)
    kind, inner = sp
    opt = kind.endswith("?")
    kind = kind.rstrip("?")
    if v is None:
        if opt:
            return None
        raise Problem(f"{where(path)}: null, expected {'an object' if kind in ('map', 'model') else kind}")
    if kind == "enum":
        if v not in inner:
            raise Problem(f"{where(path)}: {short(v)} is not one of {', '.join(inner)}")
        return v
    if kind == "list":
        if not isinstance(v, list):
            raise Problem(f"{where(path)}: {kind_of(v)}, expected a list")
        return [convert(x, inner, f"{path}[{i}]") for i, x in enumerate(v)]
    if kind == "map":
        if not isinstance(v, dict):
            raise Problem(f"{where(path)}: {kind_of(v)}, expected an object")
        return v
    if kind == "model":
        return inner.from_dict(v, path)
    raise ValueError(sp)


def dump(v: Any) -> Any:
    if isinstance(v, Model):
        return v.to_dict()
    if isinstance(v, list):
        return [dump(x) for x in v]
    return v


class Model:
    """Base of a document model (subclasses are dataclasses whose fields are made by `spec`)."""

    _keys: tuple[str, ...] | None = None  # the keys as read, in their order (None: built in code)
    _extra: ClassVar[dict[str, Any]] = {}  # keys the model does not declare, as read
    TITLE: ClassVar[str] = ""  # the section heading in docs/result-schema.md

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[M], v: Any, path: str = "") -> M:
        """V as this model, every declared field checked (Problem names the first bad one)."""
        if not isinstance(v, dict):
            raise Problem(f"{where(path)}: {kind_of(v)}, expected an object")
        kw = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in v:
                kw[f.name] = convert(v[f.name], f.metadata["spec"], join(path, f.name))
        obj = cls(**kw)
        names = set(kw)
        obj._keys = tuple(v)
        obj._extra = {k: x for k, x in v.items() if k not in names}
        return obj

    @classmethod
    def build(cls: type[M], **fields: Any) -> M:
        """A new object that writes exactly FIELDS, in the order given (two writers of one model
        may write different keys, e.g. the benchmark's and the history's verdict reasons)."""
        obj = cls(**fields)
        obj._keys = tuple(fields)
        return obj

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the keys as read, in their order (declared fields from this object,
        the others as read), then declared fields set since; built in code: every declared field."""
        names = self.field_names()
        if self._keys is None:
            return {n: dump(getattr(self, n)) for n in names}
        out = {k: dump(getattr(self, k)) if k in names else self._extra[k] for k in self._keys}
        for n in names:
            if n not in out and getattr(self, n) is not None:
                out[n] = dump(getattr(self, n))
        return out

    # -- JSON text: the subclass names its error type, the fix it suggests and its layout
    ERROR: ClassVar[type[Exception]] = Problem
    FIX: ClassVar[str] = ""
    INDENT: ClassVar[int | None] = 1
    SEPARATORS: ClassVar[tuple[str, str] | None] = None
    NEWLINE: ClassVar[str] = "\n"

    @classmethod
    def check(cls: type[M], v: Any, where_: str) -> M:
        """V as this model, or the class's ERROR: one line naming WHERE_ and the field."""
        try:
            return cls.from_dict(v)
        except Problem as exc:
            raise cls.ERROR(f"{where_}: {exc}", cls.FIX) from None  # type: ignore[call-arg]

    @classmethod
    def from_json(cls: type[M], text: str | bytes, where_: str = "document") -> M:
        """Parse TEXT and check it (the class's ERROR names WHERE_ and the field)."""
        import json

        try:
            v = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise cls.ERROR(f"{where_}: not valid JSON ({exc})", cls.FIX) from None  # type: ignore[call-arg]
        return cls.check(v, where_)

    def to_json(self) -> str:
        """The document's text, as gpubox writes it (byte for byte what was read, for a document
        gpubox wrote)."""
        import json

        return (
            json.dumps(self.to_dict(), indent=self.INDENT, separators=self.SEPARATORS, default=str)
            + self.NEWLINE
        )

    def get(self, name: str, default: Any = None) -> Any:
        """A key the model does not declare (a forward-compatible addition), as read."""
        return self._extra.get(name, default)
