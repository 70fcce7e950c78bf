"""The op table's two halves agree: csrc/op_list.h (TE_FAST_OPS, expanded through TE_FAST_SOFTMAX
as the preprocessor would) and te_fast/_registry.py OPS have the same ops in the same order, each
with the same entry point, mask mode and rank; a difference fails naming the op and the field.
The comparison is also fed deliberately different tables, to prove it can fail."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from te_fast import _registry

ROOT = Path(__file__).resolve().parents[1]
OP_LIST = ROOT / "csrc" / "op_list.h"
RULES = ROOT / "csrc" / "rules.h"
HEADER = "csrc/op_list.h"
REGISTRY = "te_fast/_registry.py OPS"

_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)(.*)$", re.M)
_CALL = re.compile(r"(\w+)\s*\(([^()]*)\)")
_ROW = "<row>"  # what TE_FAST_OPS's X stands for while expanding: one op


def _macros(text: str) -> dict[str, tuple[list[str], str]]:
    """name -> (parameters, body) of each function-like macro, comments dropped and continued
    lines joined."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text).replace("\\\n", " ")
    return {
        name: ([p.strip() for p in params.split(",")], body)
        for name, params, body in _DEFINE.findall(text)
    }


def _expand(macros, name: str, args: list[str]) -> list[tuple[str, ...]]:
    params, body = macros[name]
    if len(args) != len(params):
        raise ValueError(f"{HEADER}: {name} takes {len(params)} arguments, got {args}")
    env = dict(zip(params, args))
    rows = []
    for callee, raw in _CALL.findall(body):
        callee = env.get(callee, callee)
        # each argument with the parameters put in, pasted where ## says so
        values = [
            "".join(env.get(part.strip(), part.strip()) for part in arg.split("##"))
            for arg in raw.split(",")
        ]
        if callee == _ROW:
            rows.append(tuple(values))
        elif callee in macros:
            rows += _expand(macros, callee, values)
        else:
            raise ValueError(f"{HEADER}: {name} calls {callee}, which is no macro of the file")
    return rows


def parse_op_list(text: str) -> list[tuple[str, str, str, int]]:
    """(op, entry, mask_mode, rank) of each X(...) that TE_FAST_OPS(X) expands to, in order."""
    macros = _macros(text)
    if "TE_FAST_OPS" not in macros:
        raise ValueError(f"{HEADER}: no #define TE_FAST_OPS(X)")
    rows = []
    for row in _expand(macros, "TE_FAST_OPS", [_ROW]):
        if len(row) != 4 or not row[3].isdigit():
            raise ValueError(f"{HEADER}: expected X(op, entry, mask_mode, rank), got X{row}")
        rows.append((row[0], row[1], row[2], int(row[3])))
    return rows


def op_table_differences(header: str, ops) -> list[str]:
    """Each difference between op_list.h's text ``header`` and the registry rows ``ops`` (OpSpec),
    one line naming the op and where each side has what; [] when they agree."""
    c_rows = parse_op_list(header)
    py_rows = [(op.name, op.entry, op.mask_mode, op.rank) for op in ops]
    out = []
    for rows, where in ((c_rows, HEADER), (py_rows, REGISTRY)):
        names = [r[0] for r in rows]
        out += [f"{n}: listed {names.count(n)} times in {where}" for n in dict.fromkeys(names)
                if names.count(n) > 1]  # fmt: skip
    c_by = {r[0]: r for r in c_rows}
    py_by = {r[0]: r for r in py_rows}
    out += [f"{n}: in {HEADER}, not in {REGISTRY}" for n in c_by if n not in py_by]
    out += [f"{n}: in {REGISTRY}, not in {HEADER}" for n in py_by if n not in c_by]
    c_order = [n for n in c_by if n in py_by]
    py_order = [n for n in py_by if n in c_by]
    if c_order != py_order:
        i = next(i for i, (a, b) in enumerate(zip(c_order, py_order)) if a != b)
        out.append(
            f"order: the ops both list differ from position {i}: {c_order[i]} in {HEADER}, "
            f"{py_order[i]} in {REGISTRY} (keep the registry in op_list.h's order)"
        )
    for name in c_order:
        for field, c, py in zip(("entry", "mask_mode", "rank"), c_by[name][1:], py_by[name][1:]):
            if c != py:
                out.append(f"{name}: {field} is {c} in {HEADER} but {py} in {REGISTRY}")
    return out


def test_op_list_and_registry_agree():
    differences = op_table_differences(OP_LIST.read_text(), _registry.OPS)
    assert not differences, "csrc/op_list.h and te_fast/_registry.py disagree:\n" + "\n".join(
        differences
    )


def _replace_once(old: str, new: str):
    def mutate(text: str) -> str:
        assert text.count(old) == 1, f"the mutation's text {old!r} is not once in {HEADER}"
        return text.replace(old, new)

    return mutate


def _swap(a: str, b: str):
    def mutate(text: str) -> str:
        assert text.count(a) == 1 and text.count(b) == 1, (a, b)
        return text.replace(a, "\0").replace(b, a).replace("\0", b)

    return mutate


THD_ROW = "X(convert_thd_to_bshd, thd_to_bshd, kNoMask, 3)"
BSHD_ROW = "X(convert_bshd_to_thd, bshd_to_thd, kNoMask, 4)"
# id -> (a change to op_list.h's text, fragments the report must contain)
HEADER_MUTATIONS = {
    "mask_mode": (
        _replace_once("softmax_fwd, kTopLeftCausal,", "softmax_fwd, kBottomRightCausal,"),
        [
            "scaled_upper_triang_masked_softmax_fwd: mask_mode is kBottomRightCausal in "
            "csrc/op_list.h but kTopLeftCausal"
        ],
    ),
    "bwd_mask_mode": (  # a causal backward that would read whole rows again
        _replace_once("kTopLeftCausal, 3)", "kNoMask, 3)"),
        [
            "scaled_upper_triang_masked_softmax_bwd: mask_mode is kNoMask in csrc/op_list.h but "
            "kTopLeftCausal"
        ],
    ),
    "rank": (
        _replace_once(
            "scaled_softmax, softmax_fwd, kNoMask, kNoMask, 4",
            "scaled_softmax, softmax_fwd, kNoMask, kNoMask, 3",
        ),
        ["scaled_softmax_fwd: rank is 3 in csrc/op_list.h but 4", "scaled_softmax_bwd: rank is 3"],
    ),
    "entry": (
        _replace_once("masked_softmax, masked_softmax_fwd", "masked_softmax, softmax_fwd"),
        [
            "scaled_masked_softmax_fwd: entry is softmax_fwd in csrc/op_list.h but "
            "masked_softmax_fwd in te_fast/_registry.py OPS"
        ],
    ),
    "softmax_macro": (  # TE_FAST_SOFTMAX's own body: every backward op changes
        _replace_once("X(name##_bwd, softmax_bwd,", "X(name##_bwd, softmax_fwd,"),
        [f"{kind}_bwd: entry is softmax_fwd" for kind in _registry.SOFTMAX_KINDS],
    ),
    "renamed": (
        _replace_once("X(convert_bshd_to_thd, bshd_to_thd", "X(convert_bshd_to_thd2, bshd_to_thd"),
        [
            "convert_bshd_to_thd2: in csrc/op_list.h, not in te_fast/_registry.py OPS",
            "convert_bshd_to_thd: in te_fast/_registry.py OPS, not in csrc/op_list.h",
        ],
    ),
    "removed": (
        _replace_once(BSHD_ROW, ""),
        ["convert_bshd_to_thd: in te_fast/_registry.py OPS, not in csrc/op_list.h"],
    ),
    "order": (
        _swap(THD_ROW, BSHD_ROW),
        ["order: the ops both list differ from position 8: convert_bshd_to_thd in csrc/op_list.h"],
    ),
}


@pytest.mark.parametrize("mutation", list(HEADER_MUTATIONS))
def test_a_different_op_list_is_reported(mutation):
    mutate, fragments = HEADER_MUTATIONS[mutation]
    report = "\n".join(op_table_differences(mutate(OP_LIST.read_text()), _registry.OPS))
    for fragment in fragments:
        assert fragment in report, f"{fragment!r} not in the report:\n{report}"


def test_a_different_registry_is_reported():
    ops = list(_registry.OPS)
    i = ops.index(_registry.BY_NAME["scaled_aligned_causal_masked_softmax_fwd"])
    ops[i] = dataclasses.replace(ops[i], mask_mode=_registry.TOP_LEFT_CAUSAL)
    assert op_table_differences(OP_LIST.read_text(), ops) == [
        "scaled_aligned_causal_masked_softmax_fwd: mask_mode is kBottomRightCausal in "
        "csrc/op_list.h but kTopLeftCausal in te_fast/_registry.py OPS"
    ]


def test_a_table_the_parser_cannot_read_fails_loudly():
    with pytest.raises(ValueError, match="X\\(op, entry, mask_mode, rank\\)"):
        parse_op_list("#define TE_FAST_OPS(X) X(a, b, kNoMask)\n")
    with pytest.raises(ValueError, match="no #define TE_FAST_OPS"):
        parse_op_list("#define TE_FAST_OTHER(X) X(a, b, kNoMask, 4)\n")


def test_softmax_mask_modes_are_rules_enumerators_one_op_each():
    """Each softmax forward has its own mask mode, an enumerator of MaskMode (csrc/rules.h): the
    suites look the op of a mask up by it (SOFTMAX_BY_MASK_MODE)."""
    enum = re.search(r"enum\s+MaskMode\b[^{]*\{([^}]*)\}", RULES.read_text()).group(1)
    enumerators = set(re.findall(r"^\s*(k\w+)\s*=", enum, re.M))
    forwards = [op for op in _registry.OPS if op.kind == _registry.SOFTMAX_FWD]
    assert len(_registry.SOFTMAX_BY_MASK_MODE) == len(forwards), [op.mask_mode for op in forwards]
    assert {op.mask_mode for op in _registry.OPS} <= enumerators, enumerators
    assert _registry.SOFTMAX_KINDS == tuple(op.public for op in forwards)


def test_python_defined_ops_stay_apart_from_the_csrc_ops():
    """PYTHON_OPS (te_fast/_attention_core.py defines them) have no op_list.h row and no name of
    one; each backward they name is a te_fast op."""
    header_names = {row[0] for row in parse_op_list(OP_LIST.read_text())}
    python_names = {op.name for op in _registry.PYTHON_OPS}
    assert not python_names & header_names
    assert not python_names & set(_registry.OP_NAMES)
    for op in _registry.PYTHON_OPS:
        assert op.backward is None or op.backward in python_names | header_names, op


def test_python_defined_ops_are_registered_with_their_rows():
    torch = pytest.importorskip("torch")
    import te_fast

    if te_fast.UNAVAILABLE_REASON is not None:
        pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}")
    for op in _registry.PYTHON_OPS:
        registered = getattr(torch.ops.te_fast, op.name).default
        want = torch._C.parse_schema(f"te_fast::{op.name}{op.schema}")
        assert str(registered._schema) == str(want)
        tags = {t.name for t in registered.tags}
        assert tags == {t for t in op.tags if hasattr(torch.Tag, t)}, (op.name, tags)
