"""Layers point one way and no module imports itself round a loop (issue 17).

The graph is every import statement of every module under gpubox/, hwtune/, bench/ and
provision/, including imports inside functions (tests/layers_report.py builds it from the AST).
`python3 -m tests.layers_report` prints the same graph's figures.
"""

from tests.layers_report import ALLOWED, area_of, cycles, graph, layer_violations, module_files

G = graph()


def test_the_graph_sees_every_area_and_the_core():
    areas = {area_of(m) for m in module_files()}
    assert areas == set(ALLOWED)
    # function-level imports count: gpubox.simbox.persist asks the registry, gpubox.bench.runner
    # imports bench.remote inside run_box
    assert "gpubox.areas" in G["gpubox.simbox.persist"]
    assert "gpubox.bench.remote" in G["gpubox.bench.runner"]


def test_core_imports_no_area():
    bad = [
        f"{a} -> {b}" for a in sorted(G) if area_of(a) == "core" for b in sorted(G[a]) if area_of(b) != "core"
    ]
    assert bad == []


def test_areas_import_only_the_core_and_the_areas_before_them():
    assert layer_violations(G) == []


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
