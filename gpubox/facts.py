"""Facts: how to read one piece of host state, plus a pure parse (pyinfra's `host.get_fact`).

A fact class says where it is read ("host" = the Proxmox host, "container" = the LXC guest,
"box" = both: `read` gets the context, for a fact whose sources span the two, e.g. the GPU
topology from NVML in the container, else the host's sysfs, else the inventory), how
(`read(host, *args)`: file reads or an argv through the transport, nothing else) and how the
raw answer becomes a value (`parse(raw, *args)`: pure, so tests feed it recorded text). The
context caches each (fact, args) once per run; `Context.forget()` drops the cache after an apply
so verify reads the host again.
"""

from __future__ import annotations

import threading
from typing import Any, Generic, Hashable, TypeVar

T = TypeVar("T")


class Fact(Generic[T]):
    """Subclass and set `where`, `read` and (when the raw answer needs it) `parse`; `Fact[V]`
    names the type of the parsed value V (what `ctx.fact` returns)."""

    where: str = "host"

    @staticmethod
    def read(host, *args) -> Any:
        raise NotImplementedError

    @staticmethod
    def parse(raw: Any, *args) -> Any:  # a subclass of Fact[V] returns V
        return raw

    @classmethod
    def key(cls, *args) -> tuple[Hashable, ...]:
        return (cls.__module__, cls.__qualname__, cls.where, *args)


class FileText(Fact[str]):
    """A file's text on the host, "" when absent (the one generic file fact every area uses)."""

    @staticmethod
    def read(host, path: str) -> str:
        return host.read_text(path, default="")


class FactCache:
    """Values of facts read in this run; thread-safe because lanes run in parallel threads."""

    def __init__(self) -> None:
        self._values: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def get(self, ctx, fact: type[Fact[T]], *args) -> T:
        key = fact.key(*args)
        with self._lock:
            if key in self._values:
                return self._values[key]
        source = ctx if fact.where == "box" else ctx.host if fact.where == "host" else ctx.container
        value = fact.parse(fact.read(source, *args), *args)
        self.put(fact, value, *args)
        return value

    def put(self, fact: type[Fact[T]], value: T, *args) -> None:
        """A fact's value read elsewhere (the control node hands the container side what it read
        on the Proxmox host): cached as if read in this run."""
        with self._lock:
            self._values[fact.key(*args)] = value

    def forget(self, where: str | None = None) -> None:
        with self._lock:
            if where is None:
                self._values.clear()
            else:
                self._values = {k: v for k, v in self._values.items() if k[2] != where}
