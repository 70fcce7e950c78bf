"""docs/adapters.md and suites/adapters/base.py agree: the capability table names exactly
CAPABILITIES, with each one's default; the declaration tables ("Declaring what it supports": the
attributes, and the optional-argument flags) name only attributes Adapter has, every supports_*
flag and every other declaration of Adapter among them, each with the default Adapter gives it.
CPU only, no torch work."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from pathlib import Path

import pytest

from suites.adapters.base import CAPABILITIES, Adapter

DOC = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"
CODE = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")
# documented outside the tables: the interface's code block ("name = ...")
OUTSIDE_TABLES = {"name"}


def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """First header cell -> the rows (header cell -> text) of each markdown table in ``text``."""
    found: dict[str, list[dict[str, str]]] = {}
    block: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2:
            header, _, *rows = ([c.strip() for c in r.strip().strip("|").split("|")] for r in block)
            found.setdefault(header[0], []).extend(dict(zip(header, r)) for r in rows)
        block = []
    return found


def documented_value(cell: str):
    """The Python value a default cell names: its first `code` span as a literal (`True`,
    `("cpu", "cuda")`, `{}`), a dotted name to import (`te_ref.layouts.LAYOUTS`), builtin names
    (`(ValueError,)`), else its words (`vanilla off-by-one learnable`)."""
    spans = CODE.findall(cell)
    assert spans, f"no `code` default in {cell!r}"
    text = spans[0]
    with_names = None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    if DOTTED.match(text):
        module, _, attr = text.rpartition(".")
        return getattr(importlib.import_module(module), attr)
    try:
        tree = ast.parse(text, mode="eval")
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        if names and all(hasattr(builtins, n) for n in names):
            with_names = eval(compile(tree, "<doc>", "eval"), {"__builtins__": builtins})
    except SyntaxError:
        pass
    return with_names if with_names is not None else tuple(text.split())


def _names(cell: str) -> list[str]:
    return [n for n in CODE.findall(cell) if n.isidentifier()]


def _as_declared(value, default):
    return tuple(value) if isinstance(default, tuple) else value


@pytest.fixture(scope="module")
def doc_tables():
    found = tables(DOC.read_text())
    for first in ("capability", "attribute", "flag"):
        assert first in found, f"docs/adapters.md has no table headed '| {first} |'"
    return found


def declarations() -> dict[str, object]:
    """Adapter's declared data attributes (no methods), with their defaults."""
    return {
        n: v for n, v in vars(Adapter).items()
        if not n.startswith("_") and not callable(v) and not isinstance(v, (property, staticmethod,
                                                                            classmethod))
    }  # fmt: skip


def test_tables_are_read_honestly():
    text = "| a | b |\n|---|---|\n| `x`, `y` | `(1, 2)` |\n\n| c | d |\n|---|---|\n| `z` | w |\n"
    assert tables(text) == {
        "a": [{"a": "`x`, `y`", "b": "`(1, 2)`"}], "c": [{"c": "`z`", "d": "w"}],
    }  # fmt: skip
    assert documented_value("`True`") is True
    assert documented_value('all 19 (`te_ref.layouts.LAYOUTS`)') is importlib.import_module(
        "te_ref.layouts"
    ).LAYOUTS
    assert documented_value("`(ValueError,)`") == (ValueError,)
    assert documented_value("`no_bias alibi`") == ("no_bias", "alibi")


def test_capability_table_is_capabilities(doc_tables):
    rows = doc_tables["capability"]
    documented = [n for r in rows for n in _names(r["capability"])]
    assert sorted(documented) == sorted(CAPABILITIES), (
        f"docs/adapters.md's capability table names {sorted(documented)}; "
        f"suites.adapters.base.CAPABILITIES: {sorted(CAPABILITIES)}"
    )
    assert all("default" in r for r in rows), "the capability table has no default column"
    wrong = {
        n: (r["default"], getattr(Adapter, n)) for r in rows for n in _names(r["capability"])
        if documented_value(r["default"]) != getattr(Adapter, n)
    }  # fmt: skip
    assert not wrong, f"capability defaults documented vs Adapter's: {wrong}"


def test_declaration_tables_match_adapter(doc_tables):
    declared = declarations()
    attributes = {n: r for r in doc_tables["attribute"] for n in _names(r["attribute"])}
    flags = {n: r for r in doc_tables["flag"] for n in _names(r["flag"])}
    capabilities = {n for r in doc_tables["capability"] for n in _names(r["capability"])}
    unknown = sorted(n for n in [*attributes, *flags] if n not in declared)
    assert not unknown, f"documented, but Adapter has no such attribute: {unknown}"
    supports = sorted(n for n in declared if n.startswith("supports_"))
    missing_flags = [n for n in supports if n not in attributes and n not in flags]
    assert not missing_flags, f"supports_* flags not in docs/adapters.md: {missing_flags}"
    undocumented = sorted(
        set(declared) - set(attributes) - set(flags) - capabilities - OUTSIDE_TABLES
    )
    assert not undocumented, f"Adapter declarations not in docs/adapters.md: {undocumented}"
    wrong = {}
    for name, row in attributes.items():
        value = documented_value(row["default"])
        if _as_declared(value, declared[name]) != declared[name]:
            wrong[name] = (row["default"], declared[name])
        count = re.match(r"all (\d+)", row["default"])
        if count and int(count[1]) != len(declared[name]):
            wrong[name] = (row["default"], f"{len(declared[name])} values")
    wrong.update({n: ("True (each flag)", declared[n]) for n in flags if declared[n] is not True})
    assert not wrong, f"defaults documented vs Adapter's: {wrong}"
