"""Layers point one way and no module imports itself round a loop (issue 17); the simulator is the
top floor, which nothing in the product imports but the CLI entries that build a simulated box, and
no payload gpubox runs on a box contains (issue 25).

The graph is every import statement of every module under gpubox/, hwtune/, bench/ and
provision/, including imports inside functions (tests/layers_report.py builds it from the AST).
`python3 -m tests.layers_report` prints the same graph's figures.
"""

import ast

import pytest

from tests.layers_report import (
    ALLOWED,
    SIM_ENTRIES,
    area_of,
    cycles,
    graph,
    layer_violations,
    module_files,
    sim_importers,
)

G = graph()
LOAD = graph(in_functions=False)  # only the imports that run when a module loads


def test_the_graph_sees_every_area_and_the_core():
    areas = {area_of(m) for m in module_files()}
    assert areas == set(ALLOWED)
    # function-level imports count: gpubox.simbox.cmds.pct imports provision.lxcmodel inside
    # _refuse_like_lxc, gpubox.bench.runner imports bench.remote inside run_box
    assert "gpubox.provision.lxcmodel" in G["gpubox.simbox.cmds.pct"]
    assert "gpubox.provision.lxcmodel" not in LOAD["gpubox.simbox.cmds.pct"]
    assert "gpubox.bench.remote" in G["gpubox.bench.runner"]


def test_core_imports_no_area():
    """Nor the simulator, but for `gpubox sim`'s function that builds a box (tested below)."""
    bad = [
        f"{a} -> {b}"
        for a in sorted(G)
        if area_of(a) == "core"
        for b in sorted(G[a])
        if area_of(b) != "core" and not (area_of(b) == "sim" and a in SIM_ENTRIES and b not in LOAD[a])
    ]
    assert bad == []


def test_areas_import_only_the_core_and_the_areas_before_them():
    assert layer_violations(G, LOAD) == []


def test_nothing_in_the_product_imports_the_simulator_but_the_cli_entries_lazily():
    """The simulator (gpubox.simbox) imports the areas directly; the product imports it only in the
    `gpubox sim` / `gpubox demo` commands, inside the function that builds the box."""
    importers = sim_importers(G)
    assert {e.split(" -> ")[0] for e in importers} == SIM_ENTRIES
    assert sim_importers(LOAD) == []
    # and no string hook is left between the simulator and the areas
    sim_files = [p for m, p in module_files().items() if area_of(m) == "sim"]
    assert not [p for p in sim_files if "areas.hook" in p.read_text()]
    assert (
        "gpubox.hwtune.numa" in G["gpubox.simbox.persist"]
        and "gpubox.areas" not in G["gpubox.simbox.persist"]
    )


def _payloads() -> dict[str, str]:
    """Every source gpubox runs on a box (the container or the Proxmox host): each module of each
    entry's payload (gpubox.transport.payload), as it is in the zip, and the loader."""
    from gpubox.transport import payload

    out = {"gpubox/transport/payload_loader.py": payload.LOADER.read_text()}
    for entry in payload.ENTRIES:
        files, _ = payload.unpack(payload.build(entry).stdin())
        out.update({f"{entry}: {name}": src.decode() for name, src in files.items()})
    return out


def test_every_payload_is_its_entry_and_the_gpubox_modules_it_imports_never_the_simulator():
    from gpubox.errors import GpuboxError
    from gpubox.transport import payload

    for entry in payload.ENTRIES:
        mods = payload.build(entry).modules
        assert entry in mods and not [m for m in mods if area_of(m) == "sim"], entry
        # exactly its import closure (the same graph as the layer test) and the packages above
        need, todo = set(), [entry]
        while todo:
            m = todo.pop()
            if m not in need:
                need.add(m)
                todo += G[m] - {"gpubox.transport.payload"}
        parents = {".".join(m.split(".")[:i]) for m in need for i in range(1, m.count(".") + 1)}
        assert set(mods) == need | parents, entry
    assert "gpubox.transport.payload" not in payload.build("gpubox.bench.remote").modules  # control side
    # the copier: its package, one module per idea, the integrity check, and the safe-path layer
    # every write goes through (gpubox.safepath); nothing else of gpubox
    stage = "gpubox.provision.stage"
    assert payload.build(f"{stage}.__main__").modules == (
        "gpubox",
        "gpubox.errors",
        "gpubox.provision",
        "gpubox.provision.safetensors_check",
        stage,
        *(
            f"{stage}.{m}"
            for m in (
                "__main__",
                "copier",
                "destination",
                "errors",
                "hashing",
                "lock",
                "manifest",
                "operations",
                "probe",
                "progress",
                "readers",
                "request",
                "room",
                "schedule",
                "sizes",
                "source",
                "threads",
                "verdicts",
            )
        ),
        "gpubox.safepath",
    )
    # the check finds what it forbids: an entry that imports the simulator is refused
    with pytest.raises(GpuboxError, match="would ship the simulator"):
        payload.modules_of("gpubox.commands.sim")


def _simulator_code(src: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [f"import {n}" for n in names if "simbox" in n or n.startswith("sim")]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.lower().startswith(
            ("sim", "_sim")
        ):
            found.append(f"def {node.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "GPUBOX_SIM" in node.value:
            found.append(f"reads {node.value}")
    return found


def test_the_payloads_shipped_to_a_box_hold_no_simulator_code():
    from gpubox.transport.payload import ENTRIES

    payloads = _payloads()
    assert len(payloads) > 40 and all(payloads[f"{e}: {e}"] for e in ENTRIES)
    assert {name: _simulator_code(src) for name, src in payloads.items()} == {n: [] for n in payloads}
    # the check finds what it forbids: the probe as it was before the simulation moved out
    assert _simulator_code("import os\ndef sim_env(d):\n    return os.environ.get('GPUBOX_SIM')\n") == [
        "def sim_env",
        "reads GPUBOX_SIM",
    ]


def test_no_import_cycles():
    assert cycles(G) == []


def test_the_checks_catch_what_they_forbid():
    """The same functions on a made-up graph: a cycle and an upward import are found."""
    g = {
        "gpubox.x": {"gpubox.hwtune.a"},
        "gpubox.hwtune.a": {"gpubox.bench.b"},
        "gpubox.bench.b": {"gpubox.hwtune.a"},
        "gpubox.provision.c": {"gpubox.bench.b"},
    }
    assert cycles(g) == [["gpubox.bench.b", "gpubox.hwtune.a"]]
    assert layer_violations(g) == ["gpubox.hwtune.a -> gpubox.bench.b", "gpubox.x -> gpubox.hwtune.a"]
    # the simulator: an area importing it is an upward import; a CLI entry only inside a function
    g = {
        "gpubox.bench.b": {"gpubox.simbox.x"},
        "gpubox.commands.sim": {"gpubox.simbox"},
        "gpubox.simbox.x": set(),
    }
    assert layer_violations(g, {"gpubox.commands.sim": set()}) == ["gpubox.bench.b -> gpubox.simbox.x"]
    assert layer_violations(g, {"gpubox.commands.sim": {"gpubox.simbox"}}) == [
        "gpubox.bench.b -> gpubox.simbox.x",
        "gpubox.commands.sim -> gpubox.simbox",
    ]


def test_the_architecture_page_draws_every_pipeline_step_in_order(tmp_path, monkeypatch):
    """docs/architecture.md's pipeline table is the pipeline as it runs: every step of
    gpubox.areas.PIPELINE, in order, with the module and class that hold it."""
    import importlib
    import re

    from gpubox import areas
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.simbox import build

    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    sim = build(tmp_path / "box", [])
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box(sim.box), inventory=inv, options={})
    steps = [st for m in areas.PIPELINE for st in importlib.import_module(m).steps(ctx)]
    assert {"model-stage", "drafter-stage", "bench"} <= {st.name for st in steps}  # the box has them all
    want = [
        (st.name, type(st).__module__.removeprefix("gpubox.").replace(".", "/") + ".py", type(st).__name__)
        for st in steps
    ]
    page = (module_files()["gpubox"].parent.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \| `([\w/]+\.py)` `(\w+)` \|", page, re.M)
    assert rows == want
