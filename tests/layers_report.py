"""The import graph of gpubox's modules: layers and cycles (issue 17).

Every module under gpubox/ (core), hwtune/, bench/ and provision/ (the areas, imported as
gpubox.hwtune, gpubox.bench, gpubox.provision), every import statement in it, including the ones
inside functions (those run too, only later). `python3 -m tests.layers_report` prints the figures
for the closing note; tests/test_layers.py asserts the rules on the same graph.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AREAS = ("hwtune", "bench", "provision")  # in layer order: an area may import those before it
SIM = "gpubox.simbox"  # the simulator: the top floor, over the areas it renders files with
ALLOWED = {
    "core": {"core"},
    "hwtune": {"core", "hwtune"},
    "bench": {"core", "hwtune", "bench"},
    "provision": {"core", "hwtune", "bench", "provision"},
    "sim": {"core", "hwtune", "bench", "provision", "sim"},
}
# The only product modules that may import the simulator, and only inside a function (the CLI
# commands that build a simulated box: `gpubox sim`, `gpubox demo`).
SIM_ENTRIES = {"gpubox.commands.sim", "gpubox.provision.commands.demo"}


def module_files(repo: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for core and the three areas (pyproject's package-dir mapping)."""
    out: dict[str, Path] = {}
    roots = [("gpubox", repo / "gpubox")] + [(f"gpubox.{a}", repo / a) for a in AREAS]
    for prefix, root in roots:
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            if p.resolve() != p.absolute():
                continue  # reached through a symlink (an older checkout's gpubox/<area>): counted once
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = p
    return out


def area_of(module: str) -> str:
    if module == SIM or module.startswith(SIM + "."):
        return "sim"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in AREAS else "core"


def _imported(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """Candidate dotted names one import statement brings in (most specific first per name)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        pkg = ".".join(base + ([node.module] if node.module else []))
    else:
        pkg = node.module or ""
    return [f"{pkg}.{a.name}" for a in node.names] + [pkg]


def _import_nodes(tree: ast.AST, in_functions: bool):
    """Every import statement, or (in_functions=False) only those that run when the module loads."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if not in_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))


def graph(repo: Path = REPO, in_functions: bool = True) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (a `from pkg import name` counts as pkg.name when
    that is a module of ours, else as pkg); in_functions=False: only the imports at load time."""
    files = module_files(repo)
    g: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        for node in _import_nodes(ast.parse(path.read_text(), str(path)), in_functions):
            names = _imported(node, mod, is_pkg)
            if isinstance(node, ast.ImportFrom):
                hits = [n for n in names[:-1] if n in files]
                if len(hits) < len(names) - 1 and names[-1] in files:
                    hits.append(names[-1])
            else:
                hits = [n for n in names if n in files]
                hits += [_nearest(n, files) for n in names if n not in files and _nearest(n, files)]
            g[mod].update(h for h in hits if h != mod)
    return g


def _nearest(name: str, files) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in files:
            return ".".join(parts)
        parts.pop()
    return None


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                elif nxt in on:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def layer_violations(g: dict[str, set[str]], lazy: dict[str, set[str]] | None = None) -> list[str]:
    """`a -> b` for every import that points up or sideways against the layer order. With `lazy`
    (the same graph's load-time imports), an import of the simulator by a SIM_ENTRIES module inside
    a function is allowed."""

    def ok(a: str, b: str) -> bool:
        if area_of(b) in ALLOWED[area_of(a)]:
            return True
        return lazy is not None and area_of(b) == "sim" and a in SIM_ENTRIES and b not in lazy.get(a, ())

    return [f"{a} -> {b}" for a in sorted(g) for b in sorted(g[a]) if not ok(a, b)]


def sim_importers(g: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every product module (not the simulator) that imports the simulator."""
    return [
        f"{a} -> {b}" for a in sorted(g) for b in sorted(g[a]) if area_of(a) != "sim" and area_of(b) == "sim"
    ]


def step_overrides(repo: Path = REPO) -> list[str]:
    """`Class.verb` for every Step subclass that defines check/plan/apply/verify itself."""
    out = []
    for path in module_files(repo).values():
        for c in ast.walk(ast.parse(path.read_text())):
            if isinstance(c, ast.ClassDef) and any(getattr(b, "id", None) == "Step" for b in c.bases):
                verbs = ("check", "plan", "apply", "verify")
                out += [
                    f"{c.name}.{f.name}" for f in c.body if isinstance(f, ast.FunctionDef) and f.name in verbs
                ]
    return sorted(out)


def long_functions(repo: Path = REPO, at_least: int = 150) -> list[str]:
    out = []
    for m, path in module_files(repo).items():
        for f in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                and f.end_lineno - f.lineno + 1 >= at_least
            ):
                out.append(f"{m}.{f.name} ({f.end_lineno - f.lineno + 1} lines)")
    return sorted(out)


def symlinks(repo: Path = REPO) -> list[str]:
    """Symlinks in the tree: what git tracks (mode 120000) where the checkout is a git work tree,
    else every symlink outside the usual build and tool folders (an exported snapshot)."""
    import subprocess

    r = subprocess.run(["git", "-C", str(repo), "ls-files", "-s"], capture_output=True, text=True)
    if r.returncode == 0 and (repo / ".git").exists():
        return sorted(line.split("\t", 1)[1] for line in r.stdout.splitlines() if line.startswith("120000 "))
    skip = {".git", ".venv", "venv", "build", "dist", ".pytest_cache", ".dev"}
    out = []
    for p in sorted(repo.rglob("*")):
        if p.is_symlink() and not skip & set(p.relative_to(repo).parts):
            out.append(str(p.relative_to(repo)))
    return out


def module_sizes(repo: Path = REPO) -> tuple[int, str, float, list[str]]:
    """(lines of the largest module, its path, median lines, the modules over 500 lines) over the
    same modules as the import graph (issue 36's before/after table)."""
    import statistics

    sizes = sorted(
        (len(p.read_text().splitlines()), str(p.relative_to(repo))) for p in module_files(repo).values()
    )
    over = [f"{path} {n}" for n, path in sizes if n > 500]
    return sizes[-1][0], sizes[-1][1], statistics.median(n for n, _ in sizes), over


def report(repo: Path = REPO) -> str:
    files = module_files(repo)
    g = graph(repo)
    lines = {a: 0 for a in ("core", *AREAS, "sim")}
    mods = {a: 0 for a in lines}
    for m, p in files.items():
        lines[area_of(m)] += len(p.read_text().splitlines())
        mods[area_of(m)] += 1
    cyc = cycles(g)
    bad = layer_violations(g, graph(repo, in_functions=False))
    hooks = sum(
        p.read_text().count("areas.hook(") + p.read_text().count("areas.hook_ref(") for p in files.values()
    )
    out = [f"modules: {len(files)}  lines: {sum(lines.values())}"]
    out += [f"  {a:<10} {mods[a]:>3} modules {lines[a]:>6} lines" for a in lines]
    out.append(f"import edges: {sum(len(v) for v in g.values())}")
    out.append(f"import cycles (SCCs > 1 module): {len(cyc)}")
    out += ["  " + " <-> ".join(c) for c in cyc]
    imp = sim_importers(g)
    who = sorted({e.split(" -> ")[0] for e in imp})
    out.append(
        f"product modules importing the simulator: {len(who)} ({len(imp)} imports, lazily: {', '.join(who)})"
    )
    out.append(f"string hooks resolved through gpubox.areas: {hooks}")
    out.append(f"layer violations: {len(bad)}")
    out += ["  " + b for b in bad]
    over = step_overrides(repo)
    out.append(f"step verb overrides: {len(over)} ({', '.join(over)})")
    out.append(f"functions of 150+ lines: {', '.join(long_functions(repo)) or 'none'}")
    big, where, median, over = module_sizes(repo)
    out.append(f"module lines: largest {big} ({where}), median {median:g}, over 500: {len(over)}")
    out += ["  " + o for o in over]
    out.append(f"symlinks: {len(symlinks(repo))}")
    cases = sorted((repo / "tests" / "steps").glob("*/*.json"))
    steps = sorted({c.parent.name for c in cases})
    out.append(f"data-only step cases: {len(cases)} over {len(steps)} steps ({', '.join(steps)})")
    return "\n".join(out)


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO
    print(report(root))
