"""python -m reports matrix: the feature mapping, the cells, the outputs, bad input, and the
committed picture (docs/matrix.png) against the committed runs (docs/matrix_runs/).

Small hand-made reports; CPU only, a few seconds."""

from __future__ import annotations

import ast
import builtins
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reports import matrix as mx
from reports.__main__ import main
from reports.model import build_report, write_report

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def case(nodeid, outcome="passed", fields=None, **extra):
    return {"nodeid": nodeid, "outcome": outcome, "fields": fields or {}, **extra}


def report(impls, cases, pytest_args=None):
    env = {"pytest_args": pytest_args or [], "torch": "2.13.0", "machine_class": "cpu"}
    if impls is not None:
        env["impls"] = impls
    return build_report(cases, env)


def features(nodeid, fields=None) -> set[str]:
    c = mx.Case.of(case(nodeid, fields=fields))
    return {f.key for f in mx.FEATURES if f.match(c)}


A = "suites/test_attention.py::"

# ------------------------------------------------------------------------------------ mapping


@pytest.mark.parametrize(
    "nodeid,fields,expected",
    [
        (A + "test_core[bshd_bshd_bshd-fp32-padding_causal-gqa2-pad_cu_seqlens-cpu-torch.sdpa]",
         None, {"layout_separate", "mask_padding_causal", "gqa"}),
        (A + "test_broad[bshd_sbhd_sbhd-bf16-causal-gqa2-pre_scale_bias_bhss-off-by-one-"
         "win-1_-1-diag_tl-cpu-te_fast]", None,
         {"layout_mixed", "mask_causal", "gqa", "pre_scale_bias", "softmax_off-by-one", "window",
          "bottom_right_diagonal"}),
        (A + "test_broad[thd_th2d-fp32-padding_causal_bottom_right-cross13x22-alibi-slopes_bh-"
         "learnable_param-full-max_logit-cpu-te_fast]", None,
         {"layout_thd", "mask_padding_causal_bottom_right", "alibi", "softmax_learnable",
          "max_logit"}),
        (A + "test_broad[sbhd_sb2hd-fp32-padding_causal-mqa-post_scale_bias_11ss-win3_2-"
         "pad_mask-cpu-flex_attention]", None,
         {"layout_packed", "mask_padding_causal", "gqa", "post_scale_bias", "window"}),
        (A + "test_thd_inference[thd_sbhd_sbhd-fp32-padding_causal_bottom_right-gqa2-cache+9-cpu]",
         None, {"thd_inference", "mask_padding_causal_bottom_right", "gqa"}),
        (A + "test_default_scale[bshd_bshd_bshd-fp32-causal-mla16x11-scale_default-cpu]", None,
         {"layout_separate", "mask_causal", "mla"}),
        # the recorded fields win over the id: shapes say GQA, the layout is thd inference; MLA
        # is the id's marker alone (the literal pins' v = identity has dv != d)
        (A + "test_core[x]", {"layout": "thd_bshd_bshd", "mask_type": "padding",
                              "shapes": {"h": 4, "hg": 2, "d": 16, "dv": 8}},
         {"thd_inference", "mask_padding", "gqa"}),
        ("suites/test_semantics.py::test_mask_table[causal-sbhd_max_logit-fp32-cpu-te_fast]",
         {"layout": "sbhd_sbhd_sbhd", "mask_type": "causal", "table": "sbhd_max_logit"},
         {"layout_separate", "mask_causal", "max_logit"}),
        ("suites/test_semantics.py::test_mask_table[padding-bshd_off_by_one-bf16-cpu]",
         {"layout": "bshd_bshd_bshd", "mask_type": "padding", "softmax_type": "off-by-one",
          "table": "bshd_off_by_one"},
         {"layout_separate", "mask_padding", "softmax_off-by-one"}),
        # FP8 cases count for FP8 alone, not for their layout or mask
        ("suites/test_semantics.py::test_mask_table[causal-bshd_fp8-bf16-cpu-te_fast]",
         {"layout": "bshd_bshd_bshd", "mask_type": "causal", "table": "bshd_fp8"}, {"fp8"}),
        ("suites/test_fp8.py::test_fp8_close_to_f16[sbh3d-delayed-cpu]", None, {"fp8"}),
        ("suites/test_fp8.py::test_fp8_argument_errors[cpu]", None, {"fp8", "argument_checks"}),
        ("suites/test_compile.py::test_compiled[bshd_bshd_bshd-fp32-causal-cpu-te_fast.aot_eager0]",
         None, {"compile"}),
        ("suites/test_compile.py::test_compiled[sbh3d-bf16-causal-cuda-torch.sdpa.cudagraph]",
         None, {"cuda_graphs"}),
        ("suites/test_compile.py::test_compiled[x]", {"impl": "te_fast.cudagraphs_backend"},
         {"cuda_graphs"}),
        ("suites/test_compile.py::test_dynamic_shapes[sbh3d-cpu]", None, {"compile"}),
        ("suites/test_compile.py::test_replays_leave_memory_flat", None, {"cuda_graphs"}),
        ("suites/test_dropout.py::test_dropout_drops_probabilities[0.2-cpu]", None, {"dropout"}),
        (A + "test_dropout_statistics[0.1-cpu]", None, {"dropout"}),
        ("suites/test_determinism.py::test_module_dropout_same_seed[cpu]", None,
         {"determinism", "dropout"}),
        ("suites/test_determinism.py::test_module_determinism[bshd_bshd_bshd-bf16-causal-gqa2-"
         "cpu-flex_attention]", None, {"determinism"}),
        # te_fast's ops: no implementation's module, no row
        ("suites/test_determinism.py::test_op_determinism[scaled_softmax-fp32-cpu]", None, set()),
        ("suites/test_semantics_values.py::test_bias_example[post-bf16-cpu-torch.sdpa]",
         {"layout": "bshd_bshd_bshd", "mask_type": "no_mask", "bias_type": "post_scale_bias",
          "table": "bias_example"}, {"layout_separate", "mask_no_mask", "post_scale_bias"}),
        ("suites/test_semantics_values.py::test_max_logit_over_batch_with_padding[fp32-cpu]",
         {"layout": "thd_thd_thd", "mask_type": "padding"},
         {"layout_thd", "mask_padding", "max_logit"}),
        ("suites/test_bad_input.py::test_batch_neither_one_nor_b[mask-cpu-torch.sdpa]", None,
         {"argument_checks"}),
        (A + "test_invalid_arguments[heads-cpu]", None, {"argument_checks"}),
        # an argument rule names a mask type, but judges the refusal, not the mask
        ("suites/test_semantics.py::test_thd_takes_padding_types_only[causal-cpu]", None,
         {"argument_checks"}),
        (A + "test_no_host_sync[bshd_bshd_bshd-bf16-causal-cuda]", None, {"no_host_sync"}),
        ("suites/test_fuzz.py::test_fuzz_module[core-cpu]", None, {"fuzz"}),
        ("suites/test_fuzz.py::test_fuzz_softmax[scaled_softmax-cpu]", None, set()),
        ("suites/test_semantics.py::test_mask_table_te_ref[causal-bshd-fp32-float64]", None,
         set()),
        ("suites/test_ops.py::test_scaled_softmax[fp32-cpu]", None, set()),
    ],
)  # fmt: skip
def test_feature_mapping(nodeid, fields, expected):
    assert features(nodeid, fields) == expected


def test_ids_are_split_with_negative_windows_and_off_by_one_whole():
    c = mx.Case.of(case(A + "test_broad[bshd-off-by-one-win-1_-1-win5_0-cpu]"))
    assert c.tokens == ("bshd", "off-by-one", "win-1_-1", "win5_0", "cpu")
    assert c.window == (-1, -1) and c.softmax_type == "off-by-one"
    assert (c.file, c.test) == ("test_attention.py", "test_broad")


def test_names_match_the_suites():
    from suites import test_compile, test_semantics
    from suites.adapters import ADAPTERS, UNNAMED_IN_IDS
    from te_ref.layouts import ATTN_MASK_TYPES, LAYOUTS

    assert mx.LAYOUTS == tuple(LAYOUTS)
    assert mx.MASK_TYPES == tuple(ATTN_MASK_TYPES)
    assert set(mx.COMPILE_VARIANTS) == set(test_compile.VARIANTS)
    graphs = {v for v in test_compile.VARIANTS if test_compile._uses_cudagraphs(v)}
    assert set(mx.CUDA_GRAPH_VARIANTS) == graphs
    assert set(mx.TABLE_VARIANTS) == set(test_semantics.VARIANTS)
    assert mx.UNNAMED_IN_IDS == UNNAMED_IN_IDS
    assert set(mx.CANONICAL) == set(ADAPTERS)


def _suite_tests() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "suites").glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out += [(path.name, n.name) for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]  # fmt: skip
    return out


def test_every_suite_test_is_counted_or_left_out_on_purpose():
    """A new test in suites/ needs a decision: a row's rule (matrix.COUNTED) or UNCOUNTED."""
    tests = _suite_tests()
    assert len(tests) > 50
    undecided = [
        f"{f}::{t}"
        for f, t in tests
        if f not in mx.COUNTED
        and f"{f}::{t}" not in mx.COUNTED
        and f"{f}::{t}" not in mx.UNCOUNTED
        and f not in mx.UNCOUNTED_FILES
    ]
    assert not undecided, f"add these to a row of reports/matrix.py or to UNCOUNTED: {undecided}"
    existing = {f for f, _ in tests} | {f"{f}::{t}" for f, t in tests}
    stale = [t for t in (*mx.COUNTED, *mx.UNCOUNTED, *mx.UNCOUNTED_FILES) if t not in existing]
    assert not stale, f"reports/matrix.py names tests that do not exist: {stale}"


@pytest.mark.parametrize("test", mx.COUNTED)
def test_every_counted_test_lands_in_a_row(test):
    """COUNTED (what the test above trusts) agrees with the rows' predicates."""
    test = test if "::" in test else f"{test}::test_x"
    assert features(f"suites/{test}[bshd_bshd_bshd-fp32-causal-cpu]"), test


# -------------------------------------------------------------------------------------- cells

SDPA_ARGS = ["-p", "reports.plugin", "--impl", "torch.sdpa", "-m", "not gpu"]


def sdpa_run() -> dict:
    core = A + "test_core[{}-cpu-torch.sdpa]"
    return report(
        ["torch.sdpa"],
        [
            # separate layouts: conformant (two passed)
            case(core.format("bshd_bshd_bshd-fp32-no_mask")),
            case(core.format("sbhd_sbhd_sbhd-fp32-no_mask")),
            # packed: one passes, one is not supported
            case(core.format("bs3hd-fp32-no_mask")),
            case(core.format("sb3hd-fp32-arbitrary"), "skipped",
                 skip_reason="torch.sdpa does not support layout 'sb3hd'"),
            # thd: two fail, one with the check's own reproducer line
            case(core.format("thd_thd_thd-fp32-padding"), "failed",
                 message="AssertionError: out ratio 3.2 > 1\nreproduce: python -c 'repro()'"),
            case(core.format("thd_thd_thd-bf16-padding"), "error", message="RuntimeError: boom"),
            # mixed formats: a recorded deviation
            case(core.format("bshd_sbhd_sbhd-fp32-causal"), "xfailed",
                 skip_reason="TE deviation D1: something [TE x.py:1] reproducer: y"),
            # thd inference: not supported (two reasons, the most common wins)
            *(case(core.format(f"thd_bshd_bshd-fp32-padding_causal-v{i}"), "skipped",
                   skip_reason="torch.sdpa takes no cu_seqlens") for i in range(2)),
            case(core.format("thd_sbhd_sbhd-fp32-padding_causal"), "skipped",
                 skip_reason="reason: other"),
            # another implementation's cases in this run: left out
            case("suites/test_fp8.py::test_fp8_close_to_f16[sbh3d-delayed-cpu]", "failed",
                 fields={"impl": "te_fast.fp8"}),
            case("suites/test_semantics.py::test_mask_table_te_ref[no_mask-bshd-fp32-float64]",
                 "failed", fields={"impl": "te_ref", "layout": "bshd_bshd_bshd"}),
        ],
        SDPA_ARGS,
    )  # fmt: skip


def test_cell_states():
    m = mx.build_matrix([("sdpa.json", sdpa_run())])
    cells = {row["key"]: row["cells"]["torch.sdpa"] for row in m["rows"]}
    assert cells["layout_separate"] == {
        "state": "pass", "cases": 2, "passed": 2, "failed": 0, "skipped": 0, "xfailed": 0
    }  # fmt: skip
    packed = cells["layout_packed"]
    assert packed["state"] == "partial" and (packed["passed"], packed["skipped"]) == (1, 1)
    assert packed["reason"] == "torch.sdpa does not support layout 'sb3hd'"
    thd = cells["layout_thd"]
    assert thd["state"] == "fail" and (thd["failed"], thd["cases"]) == (2, 2)
    # one reproducer: the first failing case's (node id order), its own `reproduce:` line
    assert thd["nodeid"].endswith("[thd_thd_thd-bf16-padding-cpu-torch.sdpa]")
    assert thd["reproducer"] == (
        "python -m pytest -p no:xdist --impl torch.sdpa "
        "'suites/test_attention.py::test_core[thd_thd_thd-bf16-padding-cpu-torch.sdpa]'"
    )
    assert cells["layout_mixed"]["state"] == "known"
    assert cells["layout_mixed"]["known_reason"].startswith("TE deviation D1")
    inference = cells["thd_inference"]
    assert inference["state"] == "unsupported"
    assert inference["reason"] == "torch.sdpa takes no cu_seqlens"
    # the third case's reason does not name torch.sdpa: not its own, not counted as unsupported
    assert (inference["reason_cases"], inference["reasons"], inference["skipped"]) == (2, 1, 2)
    assert inference["other_skips"] == 1
    assert cells["mask_padding"]["state"] == "fail"  # the two thd failures count here too
    assert cells["mask_arbitrary"]["state"] == "unsupported"
    # te_fast's FP8 case and te_ref's table in this run are not torch.sdpa's
    assert cells["fp8"]["state"] == "not_run" and cells["fp8"]["cases"] == 0
    assert m["runs"]["torch.sdpa"]["cases"] == 10


def test_skips_that_are_not_the_implementations_are_not_run():
    """A combination no implementation takes, a missing device or package: not run, with the
    reason; not "not supported", and no blemish on a conformant cell."""
    core = A + "test_core[{}-cpu-torch.sdpa]"
    r = report(
        ["torch.sdpa"],
        [
            case(core.format("bs3hd-fp32-no_mask")),
            case(core.format("bs3hd-fp32-no_mask-gqa2"), "skipped",
                 skip_reason="qkv-packed layouts hold q, k, v in one buffer: no GQA/MQA"),
            case(core.format("thd_thd_thd-fp32-padding"), "skipped", skip_reason="no CUDA device"),
        ],
    )  # fmt: skip
    cells = {row["key"]: row["cells"]["torch.sdpa"] for row in mx.build_matrix([("r", r)])["rows"]}
    assert cells["layout_packed"]["state"] == "pass"
    assert (cells["layout_packed"]["skipped"], cells["layout_packed"]["other_skips"]) == (0, 1)
    assert cells["layout_thd"]["state"] == "not_run"
    assert mx.cell_text(cells["layout_thd"]) == "not run (no CUDA device)"


@pytest.mark.parametrize(
    "reason,declined",
    [
        ("transformer_engine does not support layout 'thd_thd_thd'", True),
        ("x; transformer_engine lacks dropout (...): why", True),
        ("transformer_engine takes no alibi_slopes (user ALiBi slopes)", True),
        ("transformer_engine has no sliding window", True),
        ("transformer_engine not installed: No module named 'transformer_engine'", False),
        ("torch.sdpa does not support layout 'thd_thd_thd'", False),  # another adapter
        ("qkv-packed layouts hold q, k, v in one buffer: no GQA/MQA", False),
    ],
)
def test_a_skip_is_not_supported_when_the_adapter_declined_it(reason, declined):
    skipped = case("x::t", "skipped", skip_reason=reason)
    assert mx.declined(skipped, "transformer_engine") is declined


def test_the_main_reason_groups_values_and_prefers_the_rows_topic():
    def skipped(reason):
        return case("x::t", "skipped", skip_reason=reason)

    cases = [
        skipped("s has no sliding window; s does not support layout 'thd_thd_thd'"),
        skipped("s has no sliding window; s does not support layout 't3hd'"),
        skipped("s has no sliding window"),
        skipped("s does not support bias type 'alibi'; s has no sliding window"),
    ]
    # the most common reason: every case gives it
    assert mx.main_reason(cases, (), "s") == ("s has no sliding window", 4, 3)
    # the layout row's reason: the layouts, grouped with their values
    text = "s does not support layout 't3hd', 'thd_thd_thd'"
    assert mx.main_reason(cases, ("layout",), "s") == (text, 2, 3)
    assert mx.main_reason(cases, ("alibi",), "s") == ("s does not support bias type 'alibi'", 1, 3)
    # one reason with a '; ' of its own stays whole: only the next reason of the adapter splits
    own = skipped("s lacks traceable (tracing): on the CPU; dynamo traces x; s has no window")
    assert mx.reason_parts(own, "s") == ["s has no window", "s lacks traceable (tracing): on the "
                                         "CPU; dynamo traces x"]  # fmt: skip
    # a TE deviation is its id and title, without its source and reproducer
    xfail = case("x::t", "xfailed", skip_reason="TE deviation D2: a title [TE a.py:1-2] "
                 "reproducer: python -c 'x'")  # fmt: skip
    assert mx.main_reason([xfail]) == ("TE deviation D2: a title", 1, 1)


def test_a_failing_case_shows_its_own_reproducer():
    failing = A + "test_core[thd_thd_thd-fp32-padding-cpu-torch.sdpa]"
    r = report(["torch.sdpa"], [case(failing, "failed", message="x\nreproduce: python -c 'r()'")])
    cell = next(row for row in mx.build_matrix([("r", r)])["rows"] if row["key"] == "layout_thd")
    assert cell["cells"]["torch.sdpa"]["reproducer"] == "python -c 'r()'"
    text = mx.cell_text(cell["cells"]["torch.sdpa"])
    assert text == "not conformant (1 of 1 failing); reproduce: python -c 'r()'"


def test_missing_implementations_are_not_run_columns():
    m = mx.build_matrix([("sdpa.json", sdpa_run())])
    assert m["columns"] == list(mx.CANONICAL)
    for row in m["rows"]:
        for name in ("te_fast", "flex_attention", "transformer_engine"):
            assert row["cells"][name]["state"] == "not_run"
    assert set(m["runs"]) == {"torch.sdpa"}
    md = mx.render_markdown(m)
    assert "- te_fast: not run" in md
    assert md.count("· not run") >= 3 * len(mx.FEATURES)


def test_one_run_of_two_adapters_and_cases_without_fields():
    """A run without --impl judges the default adapters: te_fast's cases carry no adapter name
    in their ids, the others do."""
    r = report(
        ["te_fast", "torch.sdpa"],
        [
            case(A + "test_core[bshd_bshd_bshd-fp32-causal-cpu]"),
            case(A + "test_core[bshd_bshd_bshd-fp32-causal-cpu-torch.sdpa]", "failed"),
            case("suites/test_compile.py::test_compiled[sbh3d-fp32-causal-cpu-torch.sdpa.aot_eager]",
                 "skipped", skip_reason="torch.sdpa lacks traceable"),
            case("suites/test_dropout.py::test_dropout_off_is_exact_identity[cpu-flex_attention]"),
        ],
    )  # fmt: skip
    m = mx.build_matrix([("r", r)])
    causal = next(row["cells"] for row in m["rows"] if row["key"] == "mask_causal")
    assert causal["te_fast"]["state"] == "pass" and causal["torch.sdpa"]["state"] == "fail"
    compile_ = next(row["cells"] for row in m["rows"] if row["key"] == "compile")
    assert compile_["torch.sdpa"]["state"] == "unsupported"
    assert compile_["te_fast"]["state"] == "not_run"
    # a case naming an adapter outside the run belongs to nobody
    assert m["runs"]["te_fast"]["cases"] == 1 and m["runs"]["torch.sdpa"]["cases"] == 2


def test_an_old_report_names_its_adapter_through_its_pytest_args():
    r = report(None, [case(A + "test_core[sbh3d-fp32-causal-cpu-flex_attention]")],
               ["--impl", "flex_attention"])  # fmt: skip
    m = mx.build_matrix([("old.json", r)])
    assert m["runs"]["flex_attention"]["cases"] == 1


def test_summaries_give_the_same_matrix(tmp_path):
    full = sdpa_run()
    small = mx.summarize_run(full, "sdpa.json")
    assert len(small["cases"]) == 10  # the other implementations' cases are dropped
    path = tmp_path / "torch.sdpa.json"
    mx.write_summary(small, path)
    from reports.model import load_report

    assert mx.build_matrix([("a", load_report(path))]) == mx.build_matrix([("b", full)])


# ----------------------------------------------------------------------------------- outputs


def test_html_is_self_contained_and_never_green_where_not_conformant():
    page = mx.render_html(mx.build_matrix([("sdpa.json", sdpa_run())]))
    assert not re.search(r"(?:src|href)=|https?://|url\(", page)
    cells = re.findall(r'<td class="cell state-(\w+)" style="background:#(\w{6});', page)
    assert {s for s, _ in cells} == {"pass", "partial", "fail", "known", "unsupported", "not_run"}

    def greenish(hex_colour):
        r, g, b = (int(hex_colour[i : i + 2], 16) for i in (0, 2, 4))
        return g > r and g > b

    for state, colour in cells:
        assert greenish(colour) == (state in ("pass", "partial")), (state, colour)
    for state in mx.STATES:
        assert f'class="state-{state}"' in page  # the legend
    assert "reproduce: <code>python -m pytest -p no:xdist --impl torch.sdpa" in page


def test_cli_writes_the_four_files(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "sdpa" / "report.json"
    write_report(sdpa_run(), run)
    out = tmp_path / "out"
    assert (
        main(["matrix", str(run), "--out", str(out), "--save-summaries", str(tmp_path / "s")]) == 0
    )
    assert {p.name for p in out.iterdir()} == {
        "matrix.json",
        "matrix.md",
        "matrix.html",
        "matrix.png",
    }
    assert (tmp_path / "s" / "torch.sdpa.json").exists()
    m = json.loads((out / "matrix.json").read_text())
    assert mx.png_digest((out / "matrix.png").read_bytes()) == mx.digest(m)
    assert "torch.sdpa: " in capsys.readouterr().out


def test_cli_without_matplotlib_skips_the_png(tmp_path, capsys, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    run = tmp_path / "report.json"
    write_report(sdpa_run(), run)
    assert main(["matrix", str(run), "--out", str(tmp_path / "out")]) == 0
    assert not (tmp_path / "out" / "matrix.png").exists()
    assert (tmp_path / "out" / "matrix.html").exists()
    assert "matrix.png skipped: matplotlib is not installed" in capsys.readouterr().out


# --------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p.write_text('{"schema": "something else"}'), "not a te-conformance report"),
        (lambda p: p.write_text("{"), "not valid JSON"),
        (lambda p: None, "no such file"),
        (lambda p: write_report(report(None, []), p), "does not say which implementation"),
    ],
)
def test_bad_input_exits_2(tmp_path, capsys, make, message):
    path = tmp_path / "report.json"
    make(path)
    assert main(["matrix", str(path), "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_two_runs_of_one_implementation_exit_2(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_report(sdpa_run(), a)
    write_report(report(["te_fast", "torch.sdpa"], []), b)
    assert main(["matrix", str(a), str(b), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"implementation 'torch.sdpa' is judged by two runs: {a} and {b}" in err


def test_no_report_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["matrix"])
    assert e.value.code == 2


# ----------------------------------------------------------------------- the plugin's impls


class _Config:
    def __init__(self, impl):
        self.impl = impl

    def getoption(self, name):
        return self.impl


def judged(impl) -> list[str]:
    """The names the suites' plugin hands the report (reports.plugin's pytest_te_report_impls)."""
    from suites.plugin import pytest_te_report_impls

    return [i["name"] for i in pytest_te_report_impls(_Config(impl))]


def test_the_report_names_the_adapters_it_judged():
    assert judged(["torch.sdpa"]) == ["torch.sdpa"]
    spec = "suites.adapters.flex_attention:FlexAttention"  # a spec: the adapter's own name
    assert judged([spec]) == ["flex_attention"]
    from suites.adapters import ADAPTERS
    from suites.plugin import pytest_te_report_impls

    default = [name for name, adapter in ADAPTERS.items() if adapter.default]
    assert judged(None) == default  # the suites' default selection
    versions = {i["name"]: i["version"] for i in pytest_te_report_impls(_Config(["torch.sdpa"]))}
    assert versions == {"torch.sdpa": f"torch {torch.__version__}"}


def test_a_report_of_the_suites_names_what_it_judged(tmp_path):
    """Through pytest: environment.impls and impl_versions come from the suites' hook."""
    out = tmp_path / "r.json"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
         "--te-report", str(out), "--impl", "torch.sdpa", "-k", "invalid_arguments and mask",
         str(ROOT / "suites" / "test_attention.py")],
        cwd=ROOT, check=False, capture_output=True, timeout=300,
    )  # fmt: skip
    env = json.loads(out.read_text())["environment"]
    assert env["impls"] == ["torch.sdpa"]
    assert env["impl_versions"] == {"torch.sdpa": f"torch {torch.__version__}"}


# ------------------------------------------------------------------ the committed picture


def committed_matrix() -> dict:
    paths = sorted((DOCS / "matrix_runs").glob("*.json"))
    assert paths, "docs/matrix_runs/ holds the runs docs/matrix.png draws (tools/matrix.sh)"
    return mx.build_matrix(mx.load_runs(paths))


def test_the_committed_matrix_is_the_committed_runs():
    """docs/matrix.{json,md,html,png} are what `python -m reports matrix` makes of the runs in
    docs/matrix_runs/ (regenerate: tools/matrix.sh)."""
    m = committed_matrix()
    assert json.loads((DOCS / "matrix.json").read_text(encoding="utf-8")) == m
    assert (DOCS / "matrix.json").read_text(encoding="utf-8") == mx.matrix_json(m)
    assert (DOCS / "matrix.md").read_text(encoding="utf-8") == mx.render_markdown(m)
    assert (DOCS / "matrix.html").read_text(encoding="utf-8") == mx.render_html(m)
    assert mx.png_digest((DOCS / "matrix.png").read_bytes()) == mx.digest(m)
    assert set(m["runs"]) == set(mx.CANONICAL)  # one run of each


def test_the_docs_hold_the_feature_table():
    text = (DOCS / "reports.md").read_text(encoding="utf-8")
    assert mx.feature_table_markdown() in text
