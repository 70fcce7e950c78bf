"""The features a conformance case exercises, as data: the catalogue (one row each of the
conformance matrix, `python -m te_conformance matrix`) and how a case gets its features.

A case's features are recorded with it (the report's ``features``), from two sources:

- the test declares them: ``@pytest.mark.feature("dropout")`` (or a module's ``pytestmark``);
  suites/plugin.py records the marker's keys for every case of the test. A feature not in the
  catalogue is declared where it is exercised, ``@pytest.mark.feature(Feature("paged_kv",
  "Layouts", "paged KV cache", "the paged-KV tests"))``: its definition is recorded with the
  cases and the report adds the row to the run's catalogue;
- a test that judges an attention call's values records the call's own features
  (``case_features``: layout family, mask type, window, alignment override, bias, softmax type,
  GQA/MQA, MLA, max_logit), through ``record_features`` (the eager module cases, the mask
  table, the literal pins, the fuzz; not compile or dropout, whose rows are their own).

The report tool reads the catalogue and the recorded features, never a test's name
(docs/reports.md#the-conformance-matrix). A new feature is a row here, and the tests that
exercise it declare or record it (or the one test that exercises it defines it in its marker);
nothing in the report tool changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from te_conformance.reports import record
from te_ref.layouts import ATTN_MASK_TYPES, BIAS_TYPES, parse_layout


@dataclass(frozen=True)
class Feature:
    """One row of the matrix: its ``key`` (what cases record), its ``group`` and ``label``, and
    ``rule``: which cases exercise it, in words (the matrix's legend, docs/reports.md)."""

    key: str
    group: str
    label: str
    rule: str

    def as_dict(self) -> dict:
        return asdict(self)


_VALUES = "the cases that judge an attention call's values"
LAYOUT_KINDS = {
    "separate": "sbhd, bshd: separate q, k, v",
    "packed": "sbhd, bshd: packed qkv or kv",
    "mixed": "mixed q / kv formats",
    "thd": "thd: variable lengths",
    "thd_inference": "thd inference: thd q, bshd/sbhd KV cache",
}
LAYOUT_RULES = {
    "separate": "layout sbhd_sbhd_sbhd or bshd_bshd_bshd",
    "packed": "a packed sbhd/bshd layout (sb3hd, bshd_bs2hd, ...)",
    "mixed": "layout sbhd_bshd_bshd or bshd_sbhd_sbhd",
    "thd": "q and kv in thd (thd_thd_thd, t3hd, thd_th2d, ...)",
    "thd_inference": "layout thd_bshd_bshd or thd_sbhd_sbhd",
}
SINK_SOFTMAX_TYPES = ("off-by-one", "learnable")
NON_DEFAULT_BIASES = tuple(b for b in BIAS_TYPES if b != "no_bias")

FEATURES: tuple[Feature, ...] = (
    *(
        Feature(f"layout_{kind}" if kind != "thd_inference" else kind, "Layouts", label,
                f"{_VALUES} with {LAYOUT_RULES[kind]}")
        for kind, label in LAYOUT_KINDS.items()
    ),
    *(Feature(f"mask_{m}", "Mask types", m, f"{_VALUES} with attn_mask_type {m}")
      for m in ATTN_MASK_TYPES),
    Feature("window", "Windows", "sliding window (window_size)",
            f"{_VALUES} that pass window_size ((-1, -1) included)"),
    Feature("bottom_right_diagonal", "Windows", "bottom_right_diagonal override",
            f"{_VALUES} that pass bottom_right_diagonal"),
    *(Feature(b, "Biases", b, f"{_VALUES} with core_attention_bias_type {b}")
      for b in NON_DEFAULT_BIASES),
    *(Feature(f"softmax_{s}", "Softmax types", s, f"{_VALUES} with softmax_type {s}")
      for s in SINK_SOFTMAX_TYPES),
    Feature("gqa", "Heads", "GQA / MQA", f"{_VALUES} with fewer kv heads than q heads"),
    Feature("mla", "Heads", "MLA: v head dim != q, k head dim",
            f"{_VALUES} whose v head dim differs from q's"),
    Feature("max_logit", "Outputs", "max_logit (return_max_logit)",
            f"{_VALUES} that ask for max_logit"),
    Feature("fp8", "Modes", "FP8", "the FP8 suite (test_fp8) and the mask table's FP8 variant"),
    Feature("compile", "Modes", "torch.compile (fullgraph)",
            "the compile suite's variants without CUDA graphs (inductor, aot_eager; dynamic "
            "shapes on the CPU)"),
    Feature("cuda_graphs", "Modes", "CUDA graphs",
            "the compile suite's CUDA-graph variants (cudagraph, cudagraphs_backend)"),
    Feature("determinism", "Modes", "determinism", "the module determinism tests"),
    Feature("dropout", "Modes", "dropout",
            "the dropout suite, the attention suite's dropout tests, seeded dropout"),
    Feature("no_host_sync", "Modes", "no host synchronisation", "the host-sync test"),
    Feature("argument_checks", "Robustness", "argument checks (bad input)",
            "the tests of refused arguments (invalid arguments, the argument rules of the "
            "semantics table, the module rules of the bad-input suite)"),
    Feature("fuzz", "Robustness", "fuzzed module calls", "the module fuzz"),
)  # fmt: skip
BY_KEY = {f.key: f for f in FEATURES}


def catalogue() -> list[dict]:
    """The catalogue as the report stores it (environment.features)."""
    return [f.as_dict() for f in FEATURES]


def layout_kind(layout: str) -> str:
    """separate | packed | mixed | thd | thd_inference (q's format, then k's and v's)."""
    info = parse_layout(layout)
    if info.q_format == "thd":
        return "thd" if info.kv_format == "thd" else "thd_inference"
    if info.q_format != info.kv_format:
        return "mixed"
    return "packed" if info.packing in ("qkv", "kv") else "separate"


def layout_feature(layout: str) -> str:
    kind = layout_kind(layout)
    return kind if kind == "thd_inference" else f"layout_{kind}"


def case_features(case, identity_v: bool = False) -> list[str]:
    """The features of one attention call (an AttnCase, as it ran). ``identity_v``: v is the
    identity (dv = skv) so that the output rows are the probabilities (the mask table, the
    literal pins): no MLA case."""
    found = [layout_feature(case.layout), f"mask_{case.mask_type}"]
    if case.window is not None:
        found.append("window")
    if case.bottom_right_diagonal is not None:
        found.append("bottom_right_diagonal")
    if case.bias_type in NON_DEFAULT_BIASES:
        found.append(case.bias_type)
    if case.softmax_type in SINK_SOFTMAX_TYPES:
        found.append(f"softmax_{case.softmax_type}")
    if case.hg != case.h:
        found.append("gqa")
    if case.dv != case.d and not identity_v:
        found.append("mla")
    if case.return_max_logit:
        found.append("max_logit")
    return found


def record_features(*keys: str, replace: bool = False, declined: dict | None = None) -> None:
    """Record features of the running case (each a key of FEATURES); ``replace``: instead of
    those recorded so far (a substituted case's); ``declined``: {feature: reason} of those the
    case asked for that the adapter turned away, the rest of the case run without them."""
    unknown = [k for k in (*keys, *(declined or {})) if k not in BY_KEY]
    if unknown:
        raise ValueError(f"unknown feature(s) {unknown}; known: {sorted(BY_KEY)}")
    record.features(*keys, replace=replace, declined=declined)


def record_case_features(case, identity_v: bool = False, replace: bool = False) -> None:
    """Record the features of an attention call whose values the test judges."""
    record_features(*case_features(case, identity_v), replace=replace)


def record_substitute(asked, ran, reasons, identity_v: bool = False) -> None:
    """The case that ran (``ran``) in place of the one asked (``asked``), the adapter having
    declined part of it: the features of the call that ran, and each feature of the asked call
    it lacks as declined, with the adapter's reasons about it (``reasons``: Reason objects; all
    of them where none names the feature)."""
    have = case_features(ran, identity_v)
    lost = [k for k in case_features(asked, identity_v) if k not in have]
    every = "; ".join(r.text for r in reasons) or "declined by the adapter"
    declined = {k: "; ".join(r.text for r in reasons if r.feature == k) or every for k in lost}
    record_features(*have, replace=True, declined=declined)
