"""The areas gpubox is made of, and what each one registers with the core.

Layers point one way: the core (gpubox/*.py, gpubox/transport) imports no area; the areas are
ordered hwtune < bench < provision (an area imports only the core and the areas before it;
provision holds the recover orchestration); the simulator (gpubox/simbox) is the top floor: it
imports the areas directly, and only the `gpubox sim`/`gpubox demo` commands import it, lazily.
The core finds the areas through ONE configured list of module names, AREAS, loaded with
importlib -- like Django's INSTALLED_APPS -- and never names an area in an import statement
(tests/test_layers.py checks every import).

The pipeline's order is ONE list, PIPELINE: the modules with `steps(ctx) -> list[Step]`, in the
order their steps run. Each area has a small `<area>/area.py` without heavy imports that defines
`AREA = Area(...)`: its `--skip/--only` groups (a name for a set of whole step names), its CLI
commands (each "gpubox.<area>.commands.<command>:<command>", loaded lazily by gpubox.cli so
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

# The pipeline, in the order its steps run (lanes then let host and container steps overlap; a
# step's `requires` still waits for what it needs): the modules whose `steps(ctx)` give the steps.
PIPELINE = (
    "gpubox.provision.host_devices_step",  # host-devices
    "gpubox.provision.container_config_step",  # container-config
    "gpubox.provision.container_step",  # container
    "gpubox.provision.cuda_step",  # cuda
    "gpubox.hwtune",  # pcie-mrrs, pcie-link, numa-balancing, nccl-env (the `tune` steps)
    "gpubox.hwtune.pcie_acs_step",  # pcie-acs (reports only)
    "gpubox.provision.driver_packages_step",  # driver-packages (reports only)
    "gpubox.provision.kernel_log_step",  # kernel-log (reports only)
    "gpubox.provision.stage_step",  # model-stage, drafter-stage
    "gpubox.provision.docker_toolkit_step",  # docker-toolkit
    "gpubox.provision.shm_room_step",  # shm-room (after staging: it takes /dev/shm room)
    "gpubox.hwtune.gpu_probe_step",  # gpu-probe (checks only)
    "gpubox.bench.bench_step",  # bench (a measurement: recover runs it after the repairs)
)


@dataclass(frozen=True)
class Area:
    """What one area registers."""

    name: str
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)  # --skip/--only name -> step names
    commands: dict[str, str] = field(default_factory=dict)  # CLI name -> "module:attr"
    hooks: dict[str, str] = field(default_factory=dict)  # name -> "module" | "module:attr"


@lru_cache(maxsize=None)
def areas() -> tuple[Area, ...]:
    """Every area's registration, in AREAS order."""
    return tuple(importlib.import_module(f"{name}.area").AREA for name in AREAS)


def step_groups() -> dict[str, tuple[str, ...]]:
    """--skip/--only group name -> step names, every area's (a name registered twice is a bug)."""
    out: dict[str, tuple[str, ...]] = {}
    for a in areas():
        for name, steps in a.groups.items():
            if name in out:
                raise ValueError(f"group {name!r} registered twice (area {a.name})")
            out[name] = tuple(steps)
    return out


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
