"""The conformance matrix: features against implementations, from the reports of several runs.

`python -m reports matrix RUN.json...` reads report.json files (one run per implementation, from
`python -m reports run --impl NAME`) and draws one table. A row is a feature (a layout family, a
mask type, windows, biases, softmax types, GQA/MLA, THD inference, FP8, compile, CUDA graphs,
determinism, dropout, ...); a column is an implementation; a cell sums up the run's cases of that
feature: conformant, not conformant (how many failed and one reproducer), a recorded deviation
(expected failures: TE deviations, known failures), not supported (the most common skip reason)
or not run. Which cases belong to which feature is the table FEATURES below: a predicate on the
case's test file, test function and parameters (node id) and the fields the case recorded. One
case counts for every feature it exercises.

Written as matrix.md, matrix.html (self-contained) and matrix.png (matplotlib; skipped with a
message without it), with matrix.json, the matrix as data. docs/reports.md describes it.
"""

from __future__ import annotations

import hashlib
import html
import io
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from reports.model import FAILING, ReportError, load_report, validate
from reports.render import reproducer, te_deviations_of

SCHEMA = "te-conformance-matrix"
SCHEMA_VERSION = 1
PNG_KEY = b"te-conformance-matrix"  # the PNG's tEXt chunk: the sha256 of the matrix it draws

# The columns every matrix shows, in this order (a missing run: "not run"), then any other
# implementation in the order the runs name them.
CANONICAL = ("te_fast", "torch.sdpa", "flex_attention", "transformer_engine")

# Names the suites use, repeated here: reports/ reads reports and imports no suite.
# tests/test_reports_matrix.py checks each against its source.
LAYOUTS = (
    "sb3hd",
    "sbh3d",
    "sbhd_sb2hd",
    "sbhd_sbh2d",
    "sbhd_sbhd_sbhd",
    "bs3hd",
    "bsh3d",
    "bshd_bs2hd",
    "bshd_bsh2d",
    "bshd_bshd_bshd",
    "t3hd",
    "th3d",
    "thd_t2hd",
    "thd_th2d",
    "thd_thd_thd",
    "sbhd_bshd_bshd",
    "bshd_sbhd_sbhd",
    "thd_bshd_bshd",
    "thd_sbhd_sbhd",
)  # fmt: skip  (te_ref/layouts.py LAYOUTS)
MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)  # fmt: skip  (te_ref/layouts.py ATTN_MASK_TYPES)
BIAS_TYPES = ("pre_scale_bias", "post_scale_bias", "alibi")  # besides no_bias
COMPILE_VARIANTS = ("inductor", "aot_eager", "cudagraph", "cudagraphs_backend")
CUDA_GRAPH_VARIANTS = ("cudagraph", "cudagraphs_backend")  # suites/test_compile.py VARIANTS
# suites/test_semantics.py VARIANTS (the mask tables' ways of calling) -> what each adds to
# its layout, mask type and softmax type (recorded as case fields)
TABLE_VARIANTS = {
    "bshd": None, "sbhd_max_logit": "max_logit", "bshd_padmask": None, "bshd_leftpad": None,
    "bshd_off_by_one": None, "thd": None, "thd_kvcache": None, "bshd_fp8": "fp8",
    "bshd_scale0": None,
}  # fmt: skip
# the adapter whose name the suites leave out of node ids (suites/adapters UNNAMED_IN_IDS)
UNNAMED_IN_IDS = "te_fast"
# the case fields the matrix reads (a run summary keeps these alone)
FIELDS = ("impl", "layout", "mask_type", "bias_type", "softmax_type", "shapes", "table")

_TOKEN = re.compile(r"win-?\d+_-?\d+|off-by-one|[^-]+")
_WINDOW = re.compile(r"^win(-?\d+)_(-?\d+)$")
_VARIANT = re.compile(rf"\.(?P<v>{'|'.join(sorted(COMPILE_VARIANTS, key=len, reverse=True))})\d*$")


@dataclass(frozen=True)
class Case:
    """What the feature predicates see of one report case."""

    file: str  # the test file's name, "test_attention.py"
    test: str  # the test function, "test_core"
    tokens: tuple[str, ...]  # the parametrization id split at "-" ("win-1_-1", "off-by-one" whole)
    fields: dict

    @classmethod
    def of(cls, case: dict) -> Case:
        nodeid = case["nodeid"]
        path, _, rest = nodeid.partition("::")
        name = rest.rsplit("::", 1)[-1]
        test, _, params = name.partition("[")
        params = params[:-1] if params.endswith("]") else params
        return cls(
            file=path.rsplit("/", 1)[-1],
            test=test,
            tokens=tuple(_TOKEN.findall(params)),
            fields=case.get("fields") or {},
        )

    def _named(self, key: str, names: tuple[str, ...]) -> str | None:
        value = self.fields.get(key)
        if isinstance(value, str) and value in names:
            return value
        return next((t for t in self.tokens if t in names), None)

    @property
    def layout(self) -> str | None:
        return self._named("layout", LAYOUTS)

    @property
    def mask_type(self) -> str | None:
        return self._named("mask_type", MASK_TYPES)

    @property
    def bias_type(self) -> str | None:
        value = self.fields.get("bias_type")
        if isinstance(value, str):
            return value if value in BIAS_TYPES else None
        for t in self.tokens:
            for bias in BIAS_TYPES:  # an id names a bias with its shape: post_scale_bias_1hss
                if t == bias or t.startswith(bias + "_"):
                    return bias
        return None

    @property
    def softmax_type(self) -> str | None:
        value = self.fields.get("softmax_type")
        if isinstance(value, str):
            return value
        for t in self.tokens:
            if t in ("off-by-one", "learnable", "learnable_param"):
                return t.removesuffix("_param")
        return None

    @property
    def window(self) -> tuple[int, int] | None:
        for t in self.tokens:
            if m := _WINDOW.match(t):
                return int(m[1]), int(m[2])
        return None

    def _shape(self, a: str, b: str) -> tuple | None:
        shapes = self.fields.get("shapes")
        if isinstance(shapes, dict) and isinstance(shapes.get(a), int):
            return shapes[a], shapes.get(b)
        return None

    @property
    def gqa(self) -> bool:
        s = self._shape("h", "hg")
        if s is not None:
            return s[1] is not None and s[1] != s[0]
        return any(t == "mqa" or re.fullmatch(r"gqa\d+", t) for t in self.tokens)

    @property
    def mla(self) -> bool:
        """The id marks MLA (mlaDxDV, AttnCase.id). Not the recorded shapes: the literal pins
        take v = identity, dv = skv, to read the probabilities, which is no MLA case."""
        return any(re.fullmatch(r"mla\d+x\d+", t) for t in self.tokens)

    @property
    def table(self) -> str | None:
        """The mask table variant of a test_semantics.py::test_mask_table case."""
        return self._named("table", tuple(TABLE_VARIANTS))

    @property
    def compile_variant(self) -> str | None:
        impl = self.fields.get("impl")
        for text in (impl if isinstance(impl, str) else "", *reversed(self.tokens)):
            if m := _VARIANT.search(text):
                return m["v"]
        return None

    def within(self, *tests: str) -> bool:
        """Whether the case is one of these tests: "file.py" (any test of it) or "file.py::test"."""
        return any(t in (self.file, f"{self.file}::{self.test}") for t in tests)


# The tests that compute attention and judge it against te_ref (numerics and the mask tables):
# the rows of the layouts, masks, windows, biases, softmax, heads and outputs groups count these
# alone, less their FP8 cases (the FP8 row's). Dropout, compile, determinism and argument checks
# have rows of their own: a compile failure is not a layout's.
NUMERIC = (
    "test_attention.py::test_core", "test_attention.py::test_broad",
    "test_attention.py::test_thd_inference", "test_attention.py::test_varlen",
    "test_attention.py::test_alibi", "test_attention.py::test_alignment",
    "test_attention.py::test_default_scale", "test_attention.py::test_decode",
    "test_semantics.py::test_mask_table",
    "test_semantics_values.py::test_alibi_default_slopes",
    "test_semantics_values.py::test_alibi_bias_matrix",
    "test_semantics_values.py::test_bias_example",
    "test_semantics_values.py::test_max_logit_over_batch_with_padding",
    "test_semantics_values.py::test_sink_denominators",
    "test_semantics_values.py::test_scale_zero_gradients",
)  # fmt: skip


def numeric(c: Case) -> bool:
    return c.within(*NUMERIC) and c.table != "bshd_fp8"


def _layout_kind(layout: str | None) -> str | None:
    """separate | packed | mixed | thd | thd_inference, from the layout name (te_ref/layouts.py:
    q's format first, then k's and v's, or one packed buffer)."""
    if layout is None:
        return None
    parts = layout.split("_")
    q = parts[0]
    qfmt = "thd" if q.startswith("t") else q[:2] + "hd"
    kv = parts[-1] if len(parts) > 1 else q
    kvfmt = "thd" if kv.startswith("t") else kv[:2] + "hd"
    if qfmt == "thd":
        return "thd" if kvfmt == "thd" else "thd_inference"
    if qfmt != kvfmt:
        return "mixed"
    return "packed" if ("2" in layout or "3" in layout) else "separate"


@dataclass(frozen=True)
class Feature:
    """One row: which cases exercise the feature (``match``), and that rule in words (``rule``,
    for docs/reports.md and the page's legend)."""

    key: str
    group: str
    label: str
    rule: str
    match: Callable[[Case], bool] = field(repr=False)


def _n(predicate: Callable[[Case], bool]) -> Callable[[Case], bool]:
    """The predicate on the NUMERIC cases."""
    return lambda c: numeric(c) and predicate(c)


ARGUMENT_CHECKS = (
    "test_attention.py::test_invalid_arguments",
    "test_semantics.py::test_thd_takes_padding_types_only",
    "test_semantics.py::test_attention_mask_only_with_padding_or_arbitrary",
    "test_bad_input.py::test_module_rule", "test_bad_input.py::test_batch_neither_one_nor_b",
    "test_bad_input.py::test_module_bad_cu_seqlens_on_cuda",
    "test_fp8.py::test_fp8_argument_errors",
)  # fmt: skip
DROPOUT = (
    "test_dropout.py", "test_attention.py::test_dropout_statistics",
    "test_attention.py::test_dropout_reproducible_and_backward_consistent",
    "test_attention.py::test_dropout_zero_is_identity",
    "test_determinism.py::test_module_dropout_same_seed",
)  # fmt: skip
DETERMINISM = (
    "test_determinism.py::test_module_determinism",
    "test_determinism.py::test_module_dropout_same_seed",
)
NUMERIC_RULE = "numeric"

FEATURES: tuple[Feature, ...] = (
    Feature("layout_separate", "Layouts", "sbhd, bshd: separate q, k, v",
            f"{NUMERIC_RULE} with layout sbhd_sbhd_sbhd or bshd_bshd_bshd",
            _n(lambda c: _layout_kind(c.layout) == "separate")),
    Feature("layout_packed", "Layouts", "sbhd, bshd: packed qkv or kv",
            f"{NUMERIC_RULE} with a packed sbhd/bshd layout (sb3hd, bshd_bs2hd, ...)",
            _n(lambda c: _layout_kind(c.layout) == "packed")),
    Feature("layout_mixed", "Layouts", "mixed q / kv formats",
            f"{NUMERIC_RULE} with layout sbhd_bshd_bshd or bshd_sbhd_sbhd",
            _n(lambda c: _layout_kind(c.layout) == "mixed")),
    Feature("layout_thd", "Layouts", "thd: variable lengths",
            f"{NUMERIC_RULE} whose q and kv are thd (thd_thd_thd, t3hd, thd_th2d, ...)",
            _n(lambda c: _layout_kind(c.layout) == "thd")),
    Feature("thd_inference", "Layouts", "thd inference: thd q, bshd/sbhd KV cache",
            f"{NUMERIC_RULE} with layout thd_bshd_bshd or thd_sbhd_sbhd",
            _n(lambda c: _layout_kind(c.layout) == "thd_inference")),
    *(
        Feature(f"mask_{m}", "Mask types", m, f"{NUMERIC_RULE} with attn_mask_type {m}",
                _n(lambda c, m=m: c.mask_type == m))
        for m in MASK_TYPES
    ),
    Feature("window", "Windows", "sliding window (window_size)",
            f"{NUMERIC_RULE} whose id passes a window (winL_R, (-1, -1) included)",
            _n(lambda c: c.window is not None)),
    Feature("bottom_right_diagonal", "Windows", "bottom_right_diagonal override",
            f"{NUMERIC_RULE} whose id passes bottom_right_diagonal (diag_br, diag_tl)",
            _n(lambda c: "diag_br" in c.tokens or "diag_tl" in c.tokens)),
    *(
        Feature(b, "Biases", b, f"{NUMERIC_RULE} with core_attention_bias_type {b}",
                _n(lambda c, b=b: c.bias_type == b))
        for b in BIAS_TYPES
    ),
    *(
        Feature(f"softmax_{s}", "Softmax types", s, f"{NUMERIC_RULE} with softmax_type {s}",
                _n(lambda c, s=s: c.softmax_type == s))
        for s in ("off-by-one", "learnable")
    ),
    Feature("gqa", "Heads", "GQA / MQA", f"{NUMERIC_RULE} with fewer kv heads than q heads",
            _n(lambda c: c.gqa)),
    Feature("mla", "Heads", "MLA: v head dim != q, k head dim",
            f"{NUMERIC_RULE} whose id marks MLA (mlaDxDV)", _n(lambda c: c.mla)),
    Feature("max_logit", "Outputs", "max_logit (return_max_logit)",
            f"{NUMERIC_RULE} that ask for max_logit (id max_logit, mask table sbhd_max_logit, "
            "a test named for it)",
            _n(lambda c: "max_logit" in c.tokens or c.table == "sbhd_max_logit"
               or "max_logit" in c.test)),
    Feature("fp8", "Modes", "FP8", "test_fp8.py, and the mask table's bshd_fp8 variant",
            lambda c: c.within("test_fp8.py") or c.table == "bshd_fp8"),
    Feature("compile", "Modes", "torch.compile (fullgraph)",
            "test_compile.py without CUDA graphs (variants inductor, aot_eager; dynamic shapes)",
            lambda c: c.within("test_compile.py")
            and c.compile_variant not in CUDA_GRAPH_VARIANTS
            and c.test != "test_replays_leave_memory_flat"),
    Feature("cuda_graphs", "Modes", "CUDA graphs",
            "test_compile.py's CUDA-graph variants (cudagraph, cudagraphs_backend) and replays",
            lambda c: c.within("test_compile.py")
            and (c.compile_variant in CUDA_GRAPH_VARIANTS
                 or c.test == "test_replays_leave_memory_flat")),
    Feature("determinism", "Modes", "determinism",
            "test_determinism.py's module tests (test_module_*)", lambda c: c.within(*DETERMINISM)),
    Feature("dropout", "Modes", "dropout",
            "test_dropout.py, test_attention.py's test_dropout_*, test_determinism.py's "
            "test_module_dropout_same_seed", lambda c: c.within(*DROPOUT)),
    Feature("no_host_sync", "Modes", "no host synchronisation",
            "test_attention.py::test_no_host_sync",
            lambda c: c.within("test_attention.py::test_no_host_sync")),
    Feature("argument_checks", "Robustness", "argument checks (bad input)",
            "test_attention.py::test_invalid_arguments, test_semantics.py's argument rules, "
            "test_bad_input.py's module rules, test_fp8.py::test_fp8_argument_errors",
            lambda c: c.within(*ARGUMENT_CHECKS)),
    Feature("fuzz", "Robustness", "fuzzed module calls", "test_fuzz.py::test_fuzz_module",
            lambda c: c.within("test_fuzz.py::test_fuzz_module")),
)  # fmt: skip

# Words that a skip reason explaining the feature contains: a cell's reason is the most common of
# those (else the most common of all), so that a case skipped for several reasons ("no sliding
# window; no bias type 'alibi'") shows, in the alibi row, the one about alibi.
TOPICS = {
    "layout_separate": ("layout",), "layout_packed": ("layout", "pack"),
    "layout_mixed": ("layout",), "layout_thd": ("layout",),
    "thd_inference": ("layout", "cu_seqlens"),
    **{f"mask_{m}": ("mask",) for m in MASK_TYPES},
    "window": ("window",), "bottom_right_diagonal": ("bottom_right_diagonal",),
    **{b: ("bias", "alibi") for b in BIAS_TYPES},
    "softmax_off-by-one": ("softmax",), "softmax_learnable": ("softmax",),
    "gqa": ("GQA", "MQA"), "mla": ("MLA",), "max_logit": ("max_logit",),
    "fp8": ("FP8",), "compile": ("traceable", "compile"),
    "cuda_graphs": ("capturable", "CUDA graph", "cudagraph"), "determinism": ("determinis",),
    "dropout": ("dropout",), "no_host_sync": ("sync",),
    "argument_checks": ("validates_arguments", "argument"), "fuzz": (),
}  # fmt: skip

# Every test a row's rule names (a file: all its tests).
COUNTED = (
    *NUMERIC,
    *ARGUMENT_CHECKS,
    *DROPOUT,
    "test_fp8.py",
    "test_compile.py",
    *DETERMINISM,
    "test_attention.py::test_no_host_sync",
    "test_fuzz.py::test_fuzz_module",
)
# Tests of the adapter suites that no row counts, on purpose (each test function of
# suites/test_*.py is in a row's rule or here; tests/test_reports_matrix.py checks it).
UNCOUNTED = {
    "test_semantics.py::test_table_is_well_formed": "checks the table itself, no implementation",
    "test_semantics.py::test_mask_table_te_ref": "judges te_ref, the judge (impl te_ref)",
    "test_semantics_values.py::test_tables_are_well_formed": "checks the literals themselves",
    "test_semantics_values.py::test_default_alibi_slopes_te_ref": "judges te_ref, the judge",
    "test_determinism.py::test_op_determinism": "te_fast's ops",
    "test_determinism.py::test_batch_invariance": "te_fast's ops",
    "test_attention.py::test_one_kept_key_gives_its_value_row": "an exactness check across mask "
    "types (one kept key gives its value row bit for bit), no feature of its own",
}
# Suite files that judge te_fast's ops or the tool itself, not an implementation's module: no row.
UNCOUNTED_FILES = {
    "test_ops.py": "te_fast's softmax and convert ops",
    "test_op_contracts.py": "te_fast's op contracts",
    "test_eager_core.py": "te_fast's eager core",
    "test_eager_softmax.py": "te_fast's eager softmax node",
    "test_large.py": "te_fast's ops at large sizes (GPU)",
    "test_large_cpu.py": "te_fast's ops at large sizes",
    "test_te_kernels.py": "TE's softmax kernels as ops",
    "test_divisor.py": "te_fast's division by multiply and shift",
    "test_selftest.py": "the checks themselves",
    "test_bad_input.py": "te_fast's op checks (its module rules have a row)",
    "test_fuzz.py": "te_fast's ops fuzzed (its module part has a row)",
    "test_double_backward.py": "te_fast's second-order gradients (ops and module, no adapter axis)",
    "test_dispatch_paths.py": "te_fast's dispatch paths (its eager core), no adapter axis",
}

# ------------------------------------------------------------------------------------- cells

STATES = {
    # state: (label, fill colour, text colour); a not-conformant cell is never green
    "pass": ("conformant", "#8fd19e", "#0b3d17"),
    "partial": ("conformant where supported", "#d7efc8", "#24471a"),
    "fail": ("not conformant", "#f28b82", "#5c0b05"),
    "known": ("recorded deviation (expected failure)", "#ffd27f", "#5a3b00"),
    "unsupported": ("not supported", "#d9d9d9", "#333333"),
    "not_run": ("not run", "#ffffff", "#777777"),
}
STATE_HELP = {
    "pass": "every case of the feature passed",
    "partial": "the cases it runs pass; the others skip as not supported (the count and the "
    "most common reason)",
    "fail": "a case failed or errored: the failing count and one reproducer",
    "known": "no unexpected failure, but cases fail as recorded deviations or known failures "
    "(strict xfail: TE deviations, suites/known_failures.py)",
    "unsupported": "every case skipped, declined by the implementation's adapter (\"<name> does "
    'not support ...", "lacks ...", "takes no ...", "has no ..."): the most common reason',
    "not_run": "no run of this implementation, no case of the feature in its run, or only "
    "skips that are not the implementation's (a missing device or package: the reason)",
}


# a value a skip reason quotes ('thd_thd_thd', 'off-by-one'): reasons that differ only there group
_QUOTED = re.compile(r"(?<=[\s(])'[\w.+-]+'")


# what an adapter says when it declines a case (suites/adapters/base.py: not_supported_reasons,
# unsupported_arguments, lacks)
DECLINES = ("does not", "lacks", "takes no", "has no")


def reason_parts(case: dict, name: str = "") -> list[str]:
    """The reasons a skipped or xfailed case gives, one by one: a TE deviation or fallback as
    its id and title; a skip of implementation ``name`` split where the next reason begins with
    its name (checks/attention.py joins the adapter's reasons with '; ', and one reason may hold
    '; ' of its own); each once, sorted."""
    found = te_deviations_of(case)
    if found:
        return sorted(
            {f"TE fallback: {d['title']}" if d["id"] == "fallback" else
             f"TE deviation {d['id']}: {d['title']}" for d in found}
        )  # fmt: skip
    reason = (case.get("skip_reason") or "-").strip().removeprefix("reason: ").strip() or "-"
    parts = re.split(rf"; (?={re.escape(name)} )", reason) if name else [reason]
    return sorted({p.strip() for p in parts if p.strip()})


def main_reason(
    cases: list[dict], topic: tuple[str, ...] = (), name: str = ""
) -> tuple[str, int, int]:
    """(reason, how many of the cases give it, how many distinct reasons they give): the reason
    the most cases give, the adapter's own refusals ("<name> lacks ...") first, then those naming
    the topic; reasons that differ only in a quoted value count as one, shown with their values
    ("does not support layout 't3hd', 'thd_thd_thd'")."""
    variants: dict[str, Counter] = {}  # template -> its reasons with their values
    count: Counter = Counter()  # template -> cases that give it
    for c in cases:
        parts = reason_parts(c, name)
        for template in {_QUOTED.sub("'*'", part) for part in parts}:
            count[template] += 1
        for part in parts:
            variants.setdefault(_QUOTED.sub("'*'", part), Counter())[part] += 1
    words = [w.lower() for w in topic]

    declines = tuple(f"{name} {verb} " for verb in DECLINES) if name else ()

    def rank(template: str):
        texts = [template.lower(), *(p.lower() for p in variants[template])]
        on_topic = any(w in t for w in words for t in texts)
        # the adapter's own refusals first ("<name> lacks ..."), then the topic, then the count
        return (not template.startswith(declines or "\0"), not on_topic, -count[template],
                template)  # fmt: skip

    best = min(count, key=rank)
    parts = variants[best]
    if len(parts) == 1:
        text = next(iter(parts))
    elif best.count("'*'") == 1:
        values = sorted({_QUOTED.search(p)[0] for p in parts})
        more = f" (+{len(values) - 4} more)" if len(values) > 4 else ""
        text = best.replace("'*'", ", ".join(values[:4]) + more)
    else:
        text, _ = min(parts.items(), key=lambda kv: (-kv[1], kv[0]))
        text += f" (and {len(parts) - 1} like it)"
    return text, count[best], len(count)


def declined(case: dict, name: str) -> bool:
    """Whether a skipped case's reason is the implementation's own refusal: a part of it reads
    "<name> does not ...", "<name> lacks ...", "<name> takes no ..." or "<name> has no ..."
    ("transformer_engine not installed" is not: that is this machine)."""
    starts = tuple(f"{name} {verb} " for verb in DECLINES)
    return any(p.startswith(starts) for p in reason_parts(case, name))


def _tally(
    cases: list[dict], name: str, pytest_args: list[str], topic: tuple[str, ...] = ()
) -> dict:
    """One cell from the cases of one feature in the run of implementation ``name``. A skip the
    implementation declined (``declined``) counts as not supported; any other skip is not the
    implementation's (a combination no implementation takes, a missing device or package): such
    cases count as not run."""
    passed = sum(c["outcome"] in ("passed", "xpassed") for c in cases)
    failing = sorted((c for c in cases if c["outcome"] in FAILING), key=lambda c: c["nodeid"])
    skips = [c for c in cases if c["outcome"] == "skipped"]
    own = [c for c in skips if declined(c, name)]
    other = [c for c in skips if not declined(c, name)]
    xfailed = [c for c in cases if c["outcome"] == "xfailed"]
    cell: dict = {"cases": len(cases), "passed": passed, "failed": len(failing),
                  "skipped": len(own), "xfailed": len(xfailed)}  # fmt: skip
    if other:
        cell["other_skips"] = len(other)
    if failing:
        cell["state"] = "fail"
        cell["nodeid"] = failing[0]["nodeid"]
        cell["reproducer"] = reproducer(failing[0], pytest_args)
    elif xfailed:
        cell["state"] = "known"
    elif passed:
        cell["state"] = "partial" if own else "pass"
    elif own:
        cell["state"] = "unsupported"
    else:
        cell["state"] = "not_run"
    for key, group in (("reason", own or (other if cell["state"] == "not_run" else [])),
                       ("known_reason", xfailed)):  # fmt: skip
        if group:
            cell[key], cell[f"{key}_cases"], cell[f"{key}s"] = main_reason(group, topic, name)
    return cell


NOT_RUN = {"state": "not_run", "cases": 0, "passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}

# ------------------------------------------------------------------------------------- runs


def _impl_args(pytest_args: list) -> list[str]:
    out = []
    for i, a in enumerate(pytest_args):
        if a == "--impl" and i + 1 < len(pytest_args):
            out.append(str(pytest_args[i + 1]))
        elif isinstance(a, str) and a.startswith("--impl="):
            out.append(a.partition("=")[2])
    return out


def run_impls(report: dict, source: str) -> list[str]:
    """The implementations a run judged: environment.impls (reports.plugin), else the --impl
    arguments in environment.pytest_args (an older report), else a ReportError."""
    env = report["environment"]
    impls = env.get("impls")
    if impls is not None:
        if not isinstance(impls, list) or not all(isinstance(n, str) and n for n in impls):
            raise ReportError(f"{source}: 'environment.impls' is not a list of names")
        if impls:
            return list(dict.fromkeys(impls))
    names = _impl_args(list(env.get("pytest_args") or []))
    if names:
        return list(dict.fromkeys(names))
    raise ReportError(
        f"{source}: the report does not say which implementation it judged (no environment.impls, "
        "no --impl in its pytest_args); make it with `python -m reports run --impl NAME`"
    )


def impl_of(case: dict, impls: list[str]) -> str | None:
    """Which of the run's implementations a case judged: its recorded `impl` field (the adapter's
    name, or name.variant: te_fast.fp8, torch.sdpa.aot_eager), else the adapter name that ends its
    node id; a node id without one is te_fast's (the suites leave its name out). None: another
    implementation's case (te_ref's mask tables, te_fast's own suites in another adapter's run)."""
    by_length = sorted(impls, key=len, reverse=True)
    recorded = (case.get("fields") or {}).get("impl")
    if isinstance(recorded, str):
        return next((n for n in by_length if recorded == n or recorded.startswith(n + ".")), None)
    tokens = Case.of(case).tokens
    last = tokens[-1] if tokens else ""

    def names(n: str) -> bool:
        return last == n or last.startswith(n + ".")

    found = next((n for n in by_length if names(n)), None)
    if found is None and UNNAMED_IN_IDS in impls and not any(map(names, CANONICAL)):
        return UNNAMED_IN_IDS
    return found


def _run_info(report: dict) -> dict:
    env = report["environment"]
    sel = env.get("selection") or {}
    verdict = report.get("verdict") or {}
    return {
        "torch": env.get("torch"),
        "python": env.get("python"),
        "machine_class": env.get("machine_class"),
        "git_commit": env.get("git_commit"),
        "date_utc": env.get("date_utc"),
        "selection": {k: sel.get(k) for k in ("paths", "keyword", "markexpr") if sel.get(k)},
        "verdict": verdict.get("status"),
    }


def build_matrix(runs: list[tuple[str, dict]], columns: list[str] | None = None) -> dict:
    """The matrix of (source, report) runs: one run per implementation (two runs of one
    implementation are a ReportError). ``columns``: the implementations to show, in order
    (default: CANONICAL, then the others the runs judged)."""
    by_impl: dict[str, tuple[str, dict]] = {}
    for source, report in runs:
        for name in run_impls(report, source):
            if name in by_impl:
                raise ReportError(
                    f"implementation {name!r} is judged by two runs: {by_impl[name][0]} and "
                    f"{source}; give one run per implementation"
                )
            by_impl[name] = (source, report)
    if columns is None:
        columns = [*CANONICAL, *(n for n in by_impl if n not in CANONICAL)]
    cells: dict[str, dict[str, dict]] = {f.key: {} for f in FEATURES}
    info: dict[str, dict] = {}
    for name in columns:
        if name not in by_impl:
            for f in FEATURES:
                cells[f.key][name] = dict(NOT_RUN)
            continue
        source, report = by_impl[name]
        impls = run_impls(report, source)
        args = list(report["environment"].get("pytest_args") or [])
        own = [c for c in report["cases"] if impl_of(c, impls) == name]
        views = [(c, Case.of(c)) for c in own]
        counted = set()
        for f in FEATURES:
            mine = [c for c, v in views if f.match(v)]
            counted.update(c["nodeid"] for c in mine)
            cells[f.key][name] = _tally(mine, name, args, TOPICS[f.key])
        info[name] = {**_run_info(report), "cases": len(own), "counted": len(counted)}
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "columns": list(columns),
        "rows": [
            {
                "key": f.key,
                "group": f.group,
                "label": f.label,
                "rule": f.rule,
                "cells": cells[f.key],
            }
            for f in FEATURES
        ],  # fmt: skip
        "runs": info,
    }


def load_runs(paths: list[str | Path]) -> list[tuple[str, dict]]:
    """(path, report) of each report file (a ReportError for one that is not a report)."""
    if not paths:
        raise ReportError("no report given")
    return [(str(p), load_report(p)) for p in paths]


def summarize_run(report: dict, source: str = "report") -> dict:
    """A compact copy of a run for committing (docs/matrix_runs/): a valid report holding only
    what the matrix reads (the cases of the run's own implementations, their FIELDS, outcome,
    skip reason and reproducer line), so that build_matrix gives the same matrix from it."""
    impls = run_impls(report, source)
    env = report["environment"]
    keep_env = ("impls", "pytest_args", "selection", "torch", "python", "machine_class",
                "git_commit", "date_utc")  # fmt: skip
    cases = []
    for c in report["cases"]:
        if impl_of(c, impls) is None:
            continue
        fields = {k: v for k, v in (c.get("fields") or {}).items() if k in FIELDS}
        if isinstance(fields.get("shapes"), dict):
            fields["shapes"] = {k: v for k, v in fields["shapes"].items() if k in ("h", "hg")}
        small = {"nodeid": c["nodeid"], "outcome": c["outcome"], "fields": fields}
        if c["outcome"] in ("skipped", "xfailed") and c.get("skip_reason"):
            small["skip_reason"] = c["skip_reason"]
        if c["outcome"] in FAILING:
            small["message"] = (c.get("message") or "").strip().split("\n", 1)[0][:300]
            small["longrepr"] = f"reproduce: {reproducer(c, env.get('pytest_args'))}"
        cases.append(small)
    out = {
        "schema": report["schema"],
        "schema_version": report["schema_version"],
        "environment": {**{k: env[k] for k in keep_env if k in env}, "impls": impls},
        "summary": report["summary"],
        "cases": cases,
    }
    if isinstance(report.get("verdict"), dict):
        out["verdict"] = {k: report["verdict"].get(k) for k in ("status", "reasons", "run_kind")}
    return validate(out, source)


def write_summary(summary: dict, path: Path) -> None:
    """One case a line: a small, diffable file."""
    head = {k: v for k, v in summary.items() if k != "cases"}
    text = json.dumps(head, sort_keys=True, indent=1)[:-2]  # without the closing "\n}"
    lines = [json.dumps(c, sort_keys=True) for c in summary["cases"]]
    text += ',\n "cases": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def matrix_json(matrix: dict) -> str:
    return json.dumps(matrix, indent=1, sort_keys=True) + "\n"


def digest(matrix: dict) -> str:
    """sha256 of matrix.json's text: what matrix.png records it draws."""
    return hashlib.sha256(matrix_json(matrix).encode("utf-8")).hexdigest()


# ------------------------------------------------------------------------------------- text


def cell_text(cell: dict, detail: bool = True) -> str:
    """A cell in words: its state, its counts and (detail) the reproducer or the reason."""
    s = cell["state"]
    n = cell["cases"]
    if s == "pass":
        return f"conformant ({cell['passed']} passed)"
    if s == "partial":
        text = f"conformant ({cell['passed']} passed; {cell['skipped']} not supported"
        return text + (f": {cell['reason']})" if detail else ")")
    if s == "fail":
        text = f"not conformant ({cell['failed']} of {n} failing"
        return text + (f"); reproduce: {cell['reproducer']}" if detail else ")")
    if s == "known":
        text = f"recorded deviation ({cell['xfailed']} of {n} expected failures"
        text += f", {cell['passed']} passed" if cell["passed"] else ""
        return text + (f": {cell['known_reason']})" if detail else ")")
    if s == "unsupported":
        return "not supported" + (f" ({cell['reason']})" if detail else "")
    return "not run" + (f" ({cell['reason']})" if detail and cell.get("reason") else "")


def short_text(cell: dict) -> str:
    """A cell in a few words, for the picture."""
    s = cell["state"]
    if s == "pass":
        return f"{cell['passed']} passed"
    if s == "partial":
        return f"{cell['passed']} passed, {cell['skipped']} n/s"
    if s == "fail":
        return f"{cell['failed']} of {cell['cases']} FAIL"
    if s == "known":
        done = f"{cell['passed']} passed, " if cell["passed"] else ""
        return f"{done}{cell['xfailed']} deviate"
    if s == "unsupported":
        return "not supported"
    return "not run"


_SYMBOL = {"pass": "✅", "partial": "☑️", "fail": "❌", "known": "⚠️", "unsupported": "➖",
           "not_run": "·"}  # fmt: skip


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _runs_lines(matrix: dict) -> list[str]:
    lines = []
    for name in matrix["columns"]:
        r = matrix["runs"].get(name)
        if r is None:
            lines.append(f"- {name}: not run")
            continue
        sel = r["selection"]
        where = " ".join(sel.get("paths") or []) or "the default paths"
        narrowed = "".join(f" {flag} {sel[key]!r}" for flag, key in (("-m", "markexpr"),
                           ("-k", "keyword")) if sel.get(key))  # fmt: skip
        lines.append(
            f"- {name}: {r['cases']} cases ({r['counted']} in a row) of {where}{narrowed}; "
            f"torch {r['torch']}, {r['machine_class']}, commit {r['git_commit']}, "
            f"{r['date_utc']}, verdict {r['verdict']}"
        )
    return lines


def render_markdown(matrix: dict) -> str:
    cols = matrix["columns"]
    lines = [
        "# Conformance matrix",
        "",
        "Features (rows) against implementations (columns), from one run of the conformance "
        "suites per implementation (`python -m reports matrix`; docs/reports.md says which cases "
        "make each row).",
        "",
        "| group | feature | " + " | ".join(map(_md, cols)) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for row in matrix["rows"]:
        cells = [
            f"{_SYMBOL[row['cells'][c]['state']]} {_md(cell_text(row['cells'][c]))}" for c in cols
        ]
        lines.append(f"| {_md(row['group'])} | {_md(row['label'])} | " + " | ".join(cells) + " |")
    lines += ["", "Legend:", ""]
    lines += [f"- {_SYMBOL[s]} **{STATES[s][0]}**: {STATE_HELP[s]}" for s in STATES]
    lines += ["", "Runs:", "", *_runs_lines(matrix), ""]
    return "\n".join(lines)


CSS = """
body { font-family: sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
th { background: #eee; }
td.group { color: #555; }
td.cell { max-width: 22em; }
td.cell code { font-size: 0.85em; word-break: break-all; }
.legend span { display: inline-block; padding: 0.2em 0.6em; margin: 0 0.4em 0.3em 0;
               border: 1px solid #999; }
.note { color: #666; }
"""


def render_html(matrix: dict) -> str:
    """One self-contained page: inline CSS, nothing fetched."""
    e = html.escape
    cols = matrix["columns"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>Conformance matrix</title><style>{CSS}</style></head><body>",
        "<h1>Conformance matrix</h1>",
        '<p class="note">Features (rows) against implementations (columns), from one run of the '
        "conformance suites per implementation (python -m reports matrix).</p>",
        '<p class="legend">'
        + "".join(
            f'<span class="state-{s}" style="background:{bg};color:{fg}" '
            f'title="{e(STATE_HELP[s])}">{e(label)}</span>'
            for s, (label, bg, fg) in STATES.items()
        )
        + "</p>",
        "<table><tr><th>group</th><th>feature</th>"
        + "".join(f"<th>{e(c)}</th>" for c in cols)
        + "</tr>",
    ]
    for row in matrix["rows"]:
        tds = []
        for c in cols:
            cell = row["cells"][c]
            s = cell["state"]
            _, bg, fg = STATES[s]
            body = e(cell_text(cell, detail=False))
            if s == "fail":
                body += f"<br>reproduce: <code>{e(cell['reproducer'])}</code>"
            elif cell.get("reason") and s in ("partial", "unsupported", "not_run"):
                body += f"<br><small>{e(cell['reason'])}</small>"
            elif s == "known":
                body += f"<br><small>{e(cell['known_reason'])}</small>"
            tds.append(f'<td class="cell state-{s}" style="background:{bg};color:{fg}">{body}</td>')
        parts.append(
            f'<tr><td class="group">{e(row["group"])}</td>'
            f'<td title="{e(row["rule"])}">{e(row["label"])}</td>' + "".join(tds) + "</tr>"
        )
    parts.append("</table><h2>Runs</h2><ul>")
    parts += [f"<li>{e(line[2:])}</li>" for line in _runs_lines(matrix)]
    parts.append("</ul></body></html>")
    return "\n".join(parts)


def caption(matrix: dict) -> str:
    """What the runs have in common, for the picture: machine, torch, the selection."""
    runs = list(matrix["runs"].values())
    if not runs:
        return "no runs"

    def common(get):
        values = {json.dumps(get(r), sort_keys=True) for r in runs}
        return get(runs[0]) if len(values) == 1 else None

    parts = []
    for label, get in (("machine", lambda r: r["machine_class"]), ("torch", lambda r: r["torch"]),
                       ("-m", lambda r: r["selection"].get("markexpr")),
                       ("-k", lambda r: r["selection"].get("keyword"))):  # fmt: skip
        value = common(get)
        if value:
            parts.append(f"{label} {value!r}" if label.startswith("-") else f"{label} {value}")
    return (
        f"One run per implementation ({', '.join(parts) or 'different settings'}). "
        "n/s: not supported. Reasons and reproducers: matrix.md, matrix.html."
    )


def render_png(matrix: dict) -> bytes | None:
    """The table as a PNG (matplotlib, Agg), tagged with the matrix's digest; None without
    matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        return None
    from reports.browser import tag_png

    cols, rows = matrix["columns"], matrix["rows"]
    label_w, col_w, row_h, head_h = 3.1, 1.55, 0.26, 0.45
    width = label_w + col_w * len(cols) + 0.2
    height = head_h + row_h * len(rows) + 0.75
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    for j, name in enumerate(cols):
        x = label_w + j * col_w
        ax.text(x + col_w / 2, head_h / 2, name, ha="center", va="center", fontsize=8.5,
                weight="bold")  # fmt: skip
    group = None
    for i, row in enumerate(rows):
        y = head_h + i * row_h
        if row["group"] != group:
            group = row["group"]
            ax.plot([0.05, width - 0.1], [y, y], color="#888", lw=0.8)
            ax.text(0.08, y + row_h / 2, group, va="center", fontsize=6.5, color="#666")
        ax.text(1.05, y + row_h / 2, row["label"], va="center", fontsize=7)
        for j, name in enumerate(cols):
            cell = row["cells"][name]
            _, bg, fg = STATES[cell["state"]]
            x = label_w + j * col_w
            ax.add_patch(Rectangle((x + 0.02, y + 0.02), col_w - 0.04, row_h - 0.04,
                                   facecolor=bg, edgecolor="#999", lw=0.5))  # fmt: skip
            ax.text(x + col_w / 2, y + row_h / 2, short_text(cell), ha="center", va="center",
                    fontsize=6.5, color=fg)  # fmt: skip
    handles = [Patch(facecolor=bg, edgecolor="#999", label=label)
               for label, bg, _ in STATES.values()]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=6.5, frameon=False,
               bbox_to_anchor=(0.5, 0.25 / height))  # fmt: skip
    ax.text(width / 2, height - 0.12, caption(matrix), ha="center", va="bottom", fontsize=5.5,
            color="#555", wrap=True)  # fmt: skip
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130, metadata={"Software": None})
    return tag_png(buf.getvalue(), {"matrix_sha256": digest(matrix), "columns": cols}, PNG_KEY)


def png_digest(png: bytes) -> str | None:
    """The matrix digest a matrix.png records (None: not a matrix picture)."""
    from reports.browser import png_tag

    info = png_tag(png, PNG_KEY)
    return info.get("matrix_sha256") if isinstance(info, dict) else None


def feature_table_markdown() -> str:
    """The FEATURES table in Markdown (docs/reports.md holds it; a test keeps the two equal)."""
    tests = ", ".join(NUMERIC)
    lines = [
        f"*numeric*: the cases of {tests} (matrix.NUMERIC), less the mask table's FP8 variant.",
        "",
        "| group | feature | the cases it counts |",
        "|---|---|---|",
    ]
    lines += [f"| {f.group} | {_md(f.label)} | {_md(f.rule)} |" for f in FEATURES]
    return "\n".join(lines) + "\n"


def write(matrix: dict, out: Path) -> list[Path]:
    """matrix.json, .md, .html and .png (when matplotlib is there) into out; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in (("matrix.json", matrix_json(matrix)),
                       ("matrix.md", render_markdown(matrix)),
                       ("matrix.html", render_html(matrix))):  # fmt: skip
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    png = render_png(matrix)
    if png is not None:
        (out / "matrix.png").write_bytes(png)
        written.append(out / "matrix.png")
    return written
