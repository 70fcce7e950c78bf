"""docs/adapters.md and the support declaration (suites/adapters/support.py, base.py) agree: the
field table names exactly Support's fields, each with its default; the capability, argument and
output tables name exactly CAPABILITIES, ARGUMENTS and OUTPUTS; the attribute table names
exactly the declarations an Adapter class has beside ``name`` and ``support``, each with its
default. CPU only, no torch work."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from te_conformance.suites.adapters.base import Adapter
from te_conformance.suites.adapters.support import ARGUMENTS, CAPABILITIES, OUTPUTS, Support

DOC = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"
CODE = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")
# documented outside the attribute table: the interface's code block ("name = ...") and the
# declaration itself (its own table)
OUTSIDE_TABLES = {"name", "support"}
TABLES = ("Support field", "attribute", "capability", "forward argument", "output")


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
    for first in TABLES:
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


def _check_defaults(rows: dict[str, dict], declared: dict[str, object]) -> dict:
    wrong = {}
    for name, row in rows.items():
        value = documented_value(row["default"])
        if _as_declared(value, declared[name]) != declared[name]:
            wrong[name] = (row["default"], declared[name])
        count = re.match(r"all (\d+)", row["default"])
        if count and int(count[1]) != len(declared[name]):
            wrong[name] = (row["default"], f"{len(declared[name])} values")
    return wrong


def test_field_table_is_support(doc_tables):
    rows = {n: r for r in doc_tables["Support field"] for n in _names(r["Support field"])[:1]}
    default = Support()
    fields = {f.name: getattr(default, f.name) for f in dataclasses.fields(Support)}
    assert sorted(rows) == sorted(fields), (
        f"docs/adapters.md's field table names {sorted(rows)}; Support's fields: {sorted(fields)}"
    )
    wrong = _check_defaults(rows, {n: v if not isinstance(v, dict) else dict(v)
                                   for n, v in fields.items()})  # fmt: skip
    assert not wrong, f"Support defaults documented vs declared: {wrong}"


@pytest.mark.parametrize(
    "table, names",
    [("capability", CAPABILITIES), ("forward argument", ARGUMENTS), ("output", OUTPUTS)],
)
def test_name_tables_are_the_declarations_vocabulary(doc_tables, table, names):
    documented = [n for r in doc_tables[table] for n in _names(r[table])[:1]]
    assert sorted(documented) == sorted(names), (
        f"docs/adapters.md's {table} table names {sorted(documented)}; "
        f"suites/adapters/support.py: {sorted(names)}"
    )


def test_attribute_table_is_adapter(doc_tables):
    declared = declarations()
    rows = {n: r for r in doc_tables["attribute"] for n in _names(r["attribute"])[:1]}
    unknown = sorted(n for n in rows if n not in declared)
    assert not unknown, f"documented, but Adapter has no such attribute: {unknown}"
    undocumented = sorted(set(declared) - set(rows) - OUTSIDE_TABLES)
    assert not undocumented, f"Adapter declarations not in docs/adapters.md: {undocumented}"
    wrong = _check_defaults(rows, declared)
    assert not wrong, f"defaults documented vs Adapter's: {wrong}"
