"""The areas gpubox is made of, and what each one registers with the core.

Layers point one way: the core (gpubox/*.py, gpubox/transport) imports no area; the areas are
ordered hwtune < bench < provision (an area imports only the core and the areas before it;
provision holds the recover orchestration); the simulator (gpubox/simbox) is the top floor: it
imports the areas directly, and only the `gpubox sim`/`gpubox demo` commands import it, lazily.
The core finds the areas through ONE configured list of module names, AREAS, loaded with
importlib -- like Django's INSTALLED_APPS -- and never names an area in an import statement
(tests/test_layers.py checks every import).

Each area has a small `<area>/area.py` without heavy imports that defines `AREA = Area(...)`:
its step providers (a module with `steps(ctx) -> list[Step]`) at their pipeline positions, its
`--skip/--only` groups, its CLI commands ("module:attr", loaded lazily by gpubox.cli so
`gpubox inventory list` imports no area's code) and its hooks: named "module" or "module:attr"
references resolved on demand (bench's scheduled run asks for provision's doctor this way, as it
may not import the area above it).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

# The installed areas, in layer order (an area may import only those before it).
AREAS = ("gpubox.hwtune", "gpubox.bench", "gpubox.provision")


@dataclass(frozen=True)
class Area:
    """What one area registers. Positions order providers and groups across all areas."""

    name: str
    providers: tuple[tuple[int, str], ...] = ()  # (pipeline position, module)
    groups: tuple[tuple[int, str, tuple[str, ...]], ...] = ()  # (position, group, step names)
    commands: dict[str, str] = field(default_factory=dict)  # CLI name -> "module:attr"
    hooks: dict[str, str] = field(default_factory=dict)  # name -> "module" | "module:attr"


@lru_cache(maxsize=None)
def areas() -> tuple[Area, ...]:
    """Every area's registration, in AREAS order."""
    return tuple(importlib.import_module(f"{name}.area").AREA for name in AREAS)


def step_providers() -> list[str]:
    """Modules with `steps(ctx)`, in pipeline order."""
    found = [(pos, mod) for a in areas() for pos, mod in a.providers]
    return [mod for _, mod in sorted(found, key=lambda x: x[0])]


def step_groups() -> dict[str, tuple[str, ...]]:
    """--skip/--only group name -> step names, in pipeline order."""
    found = [g for a in areas() for g in a.groups]
    return {name: steps for _, name, steps in sorted(found, key=lambda x: x[0])}


def commands() -> dict[str, str]:
    """Every area's CLI commands: name -> "module:attr" (not imported here)."""
    out: dict[str, str] = {}
    for a in areas():
        out.update(a.commands)
    return out


def hook_ref(name: str) -> str:
    """The "module" or "module:attr" an area registered under `name`, not imported (e.g. a module
    to run with `python -m`)."""
    for a in areas():
        if name in a.hooks:
            return a.hooks[name]
    raise KeyError(f"no area registers the hook {name!r} (areas: {', '.join(AREAS)})")


def hook(name: str) -> Any:
    """The module or attribute an area registered under `name` (imported now, on first use)."""
    mod, _, attr = hook_ref(name).partition(":")
    m = importlib.import_module(mod)
    return getattr(m, attr) if attr else m
