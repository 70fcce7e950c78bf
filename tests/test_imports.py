"""The project's modules import one way: no cycle anywhere (lazy, in-function imports counted
too), nothing of the report tool reaches up into the suites, and the judged (te_fast) and its
judge (te_ref) import nothing of each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package name it is imported under (setup.py get_packages)
PACKAGES = {
    "te_fast": "te_fast", "te_ref": "te_ref", "te_conformance": "te_conformance",
    "suites": "te_conformance.suites", "reports": "te_conformance.reports",
    "benchmarks": "benchmarks", "tools": "tools",
}  # fmt: skip
EXTENSIONS = ("te_fast._C",)  # compiled modules (setup.py get_extensions): no source to parse


def module_names(root: Path = ROOT, packages: dict = PACKAGES) -> dict[str, Path]:
    """Every module of the project by its import name."""
    found = {}
    for folder, name in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def _resolve(name: str, modules: dict) -> str | None:
    """The project module an imported name is (a module, or a name in a module)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph(
    root: Path = ROOT, packages: dict = PACKAGES, extensions=EXTENSIONS
) -> dict[str, set[str]]:
    """module -> the project modules it imports, at the top or inside a function."""
    sources = module_names(root, packages)
    modules = {**sources, **dict.fromkeys(extensions)}
    graph: dict[str, set[str]] = {name: set() for name in extensions}
    for name, path in sources.items():
        found = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                # a name that is a module is that module; any other name is the base's
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]  # fmt: skip
            else:
                continue
            for target in targets:
                hit = _resolve(target, modules)
                if hit is not None and hit != name:
                    found.add(hit)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each module's first import path back to itself, if any."""
    found = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            if start in graph[node]:
                found.append(path + [start])
                break
            for nxt in sorted(graph[node] - seen):
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return found


def _package_init(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "__init__.py").write_text("")


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path):
    _package_init(tmp_path / "pkg")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    graph = import_graph(tmp_path, {"pkg": "pkg"}, ())
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"]]
    assert graph["pkg.c"] == {"pkg.a"}


def test_a_mapped_folder_imports_under_its_package_name(tmp_path):
    _package_init(tmp_path / "low")
    _package_init(tmp_path / "high")
    (tmp_path / "low" / "x.py").write_text("from ns.high.y import g\n")
    (tmp_path / "high" / "y.py").write_text("def g():\n    import ns.low.x\n")
    graph = import_graph(tmp_path, {"low": "ns.low", "high": "ns.high"}, ())
    assert graph == {"ns.low": set(), "ns.low.x": {"ns.high.y"}, "ns.high": set(),
                     "ns.high.y": {"ns.low.x"}}  # fmt: skip
    assert cycles(graph)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (move the shared piece to a module both import): " + (
        "; ".join(" -> ".join(c) for c in found)
    )


def test_the_report_tool_imports_nothing_of_the_suites():
    """reports/ reads what the suites record (report.json) and never imports them: the suites
    depend on it, not the other way (docs/architecture.md)."""
    graph = import_graph()
    up = sorted(f"{m} -> {t}" for m, ts in graph.items() if m.startswith("te_conformance.reports")
                for t in ts if t.startswith("te_conformance.suites"))  # fmt: skip
    assert not up, f"reports/ imports the suites: {up}"


def test_the_judged_and_its_judge_import_nothing_of_each_other():
    graph = import_graph()
    crossing = sorted(
        f"{m} -> {t}" for m, ts in graph.items() for t in ts
        if (m.startswith("te_fast") and t.startswith("te_ref"))
        or (m.startswith("te_ref") and t.startswith("te_fast"))
    )  # fmt: skip
    assert not crossing, f"te_fast and te_ref must stay independent: {crossing}"
