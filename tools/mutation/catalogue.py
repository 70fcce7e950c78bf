"""Planted defects for the mutation harness (python -m tools.mutation): what the suites must catch.

Each defect is one exact text replacement in te_fast (Python, the shared C++ of csrc/, or the CUDA
backend of csrc/cuda/), written the way a kernel author might get it wrong on a bad day; a few are
in te_ref, the judge, where a misreading could be shared with te_fast (the literal tables of
suites/judge/test_te_ref.py catch those), and some in the gates themselves (suites/expected.py,
reports/), whose first run is the tool test that guards them. Its old text must occur exactly once
in its file (tests/test_mutation.py checks this against the tree, so an edit that moves the code
breaks the test rather than the harness). ``device`` is where the defect shows: the shared C++ and
Python run on the CPU, so their defects are judged by the CPU cases; csrc/cuda/ is judged by the
GPU cases. ``suites`` (and ``k``) name the suite files the harness runs first; a defect that
survives them is confirmed against the device's whole suite set (SUITES) before it is called a
survivor.

KNOWN_GAPS lists the defects the suites are known to miss, each with the reason: a survivor
outside it makes the harness fail.
"""

from __future__ import annotations

from dataclasses import dataclass

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Defect:
    """One planted defect: replace ``old`` (exactly one occurrence) by ``new`` in ``path``."""

    name: str
    device: str  # "cpu" | "cuda": whose cases show it
    path: str  # relative to the repository root
    old: str
    new: str
    description: str  # one line
    suites: tuple[str, ...]  # pytest paths run first (then the device's whole SUITES set)
    k: str | None = None  # a -k expression for that first run
    marker: str | None = None  # a -m expression for that first run (default: the device's)

    @property
    def native(self) -> bool:
        """Whether the defect is in C++/CUDA source (the extension must be rebuilt)."""
        return not self.path.endswith(".py")


@dataclass(frozen=True)
class SuiteSet:
    """The whole suite set of one device: what a survivor has passed."""

    paths: tuple[str, ...]
    marker: str  # pytest -m expression selecting the device's cases
    ignore: tuple[str, ...] = ()


# suites/judge/test_selftest.py checks the checks (against deliberately broken stand-ins), not
# te_fast, and test_large.py (-m large) needs ~40 GiB per test: neither belongs to the set a
# defect must pass (suites/judge/test_te_ref.py, te_ref against the literals, does: it catches
# the defects planted in te_ref). suites/te_fast/test_eager_softmax.py and
# suites/te_fast/test_eager_core.py test te_fast's eager paths directly.
_TE_FAST_TESTS = (
    "suites", "suites/te_fast/test_eager_softmax.py", "suites/te_fast/test_eager_core.py",
)  # fmt: skip
SELFTEST = "suites/judge/test_selftest.py"
SUITES = {
    "cpu": SuiteSet(_TE_FAST_TESTS, "not gpu and not large", (SELFTEST,)),
    "cuda": SuiteSet(_TE_FAST_TESTS, "gpu and not large", (SELFTEST,)),
}

ATTENTION = "suites/conformance/test_attention.py"
COMPILE = "suites/conformance/test_compile.py"
CONTRACTS = "suites/te_fast/test_op_contracts.py"
OPS = "suites/te_fast/test_ops.py"
FP8 = "suites/conformance/test_fp8.py"
FUZZ = "suites/conformance/test_fuzz.py"
OP_FUZZ = "suites/te_fast/test_op_fuzz.py"
BAD_INPUT = "suites/conformance/test_bad_input.py"
LARGE_CPU = "suites/te_fast/test_large_cpu.py"
SEMANTICS_VALUES = "suites/conformance/test_semantics_values.py"
TE_REF_LITERALS = "suites/judge/test_te_ref.py"

_PY = [
    # ---------------------------------------------------------------- the four known gaps
    Defect(
        "dropout_in_eval", "cpu", "te_fast/attention.py",
        "probs = torch.nn.functional.dropout(probs, self.attention_dropout, self.training)",
        "probs = torch.nn.functional.dropout(probs, self.attention_dropout, True)",
        "attention dropout is applied in eval mode too (training=True passed to F.dropout)",
        ("suites/conformance/test_dropout.py", ATTENTION), k="dropout",
    ),
    Defect(
        "float8_clone_shares_scale", "cpu", "te_fast/fp8.py",
        "Float8Tensor(src._data.clone(), src._scale_inv.clone(), src.dtype)",
        "Float8Tensor(src._data.clone(), src._scale_inv, src.dtype)",
        "Float8Tensor.clone() shares the original's scale_inv: a later scale update changes "
        "the copy",
        ("suites/te_fast/test_fp8_api.py",), k="float8tensor",
    ),
    Defect(
        "sink_unmasked_scaled_twice", "cpu", "te_fast/attention.py",
        "            probs = _eager_softmax.softmax(\"scaled_softmax_fwd\", ext, None, 1.0)",
        "            probs = _eager_softmax.softmax(\"scaled_softmax_fwd\", ext, None, scale)",
        "the unmasked sink softmax applies the scale a second time (to the sink logit too)",
        (ATTENTION,), k="learnable or off-by-one",
    ),
    Defect(
        "forward_default_no_mask", "cpu", "te_fast/attention.py",
        "        attn_mask_type: str = \"causal\",\n",
        "        attn_mask_type: str = \"no_mask\",\n",
        "the module's forward defaults to no_mask where TE's defaults to causal",
        ("suites/te_fast/test_module_defaults.py",),
    ),
    Defect(
        "kernel_causal_max_logit_unmasked", "cpu", "te_fast/attention.py",
        "            and not self.return_max_logit\n        )  # fmt: skip\n",
        "        )  # fmt: skip\n",
        "return_max_logit takes the causal kernel path, whose scores carry no mask: max_logit is "
        "the max over the masked-out scores too",
        (ATTENTION,), k="max_logit",
    ),
    Defect(
        "dropout_mask_reused", "cpu", "te_fast/attention.py",
        "probs = torch.nn.functional.dropout(probs, self.attention_dropout, self.training)",
        "probs = probs * self.__dict__.setdefault(('_reused_mask', probs.shape), "
        "torch.rand_like(probs) >= self.attention_dropout).to(probs.dtype) / ("
        "1 - self.attention_dropout) if self.training else probs",
        "the module draws its dropout mask once (from the dropout context's RNG) and reuses it "
        "at every later training step",
        ("suites/conformance/test_dropout.py", ATTENTION), k="dropout",
    ),
    Defect(
        "dropout_mask_shared_by_heads", "cpu", "te_fast/attention.py",
        "probs = torch.nn.functional.dropout(probs, self.attention_dropout, self.training)",
        "probs = probs * (torch.rand(probs.shape[0], 1, *probs.shape[2:], device=probs.device) >= "
        "self.attention_dropout).to(probs.dtype) / (1 - self.attention_dropout) if self.training "
        "else probs",
        "one dropout mask per batch element, shared by every head",
        ("suites/conformance/test_dropout.py", ATTENTION), k="dropout",
    ),
    Defect(
        "dropout_unscaled_in_low_precision", "cpu", "te_fast/attention.py",
        "probs = torch.nn.functional.dropout(probs, self.attention_dropout, self.training)",
        "probs = torch.nn.functional.dropout(probs, self.attention_dropout, self.training) if "
        "probs.dtype == torch.float32 else probs * (torch.rand_like(probs) >= "
        "self.attention_dropout) if self.training else probs",
        "bf16/fp16 dropout drops without rescaling the kept probabilities by 1/(1-p)",
        ("suites/conformance/test_dropout.py", ATTENTION), k="dropout",
    ),
    Defect(
        "alias_one_token", "cpu", "te_fast/attention.py",
        "        h, scale = call.h, call.scale\n"
        "        qh, kh, vh = _heads_first_qkv(call, q, k, v)\n",
        "        h, scale = call.h, call.scale\n"
        "        qh, kh, vh = _heads_first_qkv(call, q, k, v)\n"
        "        if (\n"
        "            call.sq == 1 and call.skv == 1 and call.hg == h and call.lengths_q is None\n"
        "            and call.attn_mask_type != 'arbitrary' and call.softmax_type == 'vanilla'\n"
        "            and not self.return_max_logit\n"
        "            and not (self.training and self.attention_dropout)\n"
        "        ):  # one key: every probability is 1, so the output is v itself\n"
        "            return self._output(call, vh)\n",
        "a one-query one-key fast path returns a view of v: the output aliases an input",
        (ATTENTION, FUZZ), k="alignment or module",
    ),
    Defect(
        "recompile_guard_on_length", "cpu", "te_fast/attention.py",
        "        scores = _bmm(qh, kh.transpose(-2, -1))  # (b, h, sq, skv)\n",
        "        scores = _bmm(qh, kh.transpose(-2, -1))  # (b, h, sq, skv)\n"
        "        if call.skv % 64 == 0:  # whole 64-column tiles: keep the GEMM's row layout\n"
        "            scores = scores.contiguous()\n",
        "a branch on skv % 64 guards the compiled graph: a length that flips it recompiles",
        (COMPILE,), k="dynamic",
    ),
    Defect(
        "causal_kernel_alignment_swap", "cpu", "te_fast/attention.py",
        "        if kernel_causal and not call.bottom_right:",
        "        if kernel_causal and call.bottom_right:",
        "the kernel causal path swaps top-left and bottom-right (only differs when sq != skv)",
        (ATTENTION, FUZZ), k="alignment or (causal and cross) or module",
    ),
    # ---------------------------------------------------------------- te_fast/attention.py
    Defect(
        "gqa_head_mapping", "cpu", "te_fast/attention.py",
        "    return t[:, :, None].expand(b, hg, h // hg, s, d).reshape(b, h, s, d)",
        "    return t[:, None].expand(b, h // hg, hg, s, d).reshape(b, h, s, d)",
        "GQA: query head i reads kv head i % hg instead of i // (h // hg)",
        (ATTENTION,), k="gqa",
    ),
    Defect(
        "post_scale_bias_scaled", "cpu", "te_fast/attention.py",
        "            scores = scores * scale + call.bias.to(scores.dtype)",
        "            scores = (scores + call.bias.to(scores.dtype)) * scale",
        "post_scale_bias is added before the softmax scale (pre-scale semantics)",
        (ATTENTION,), k="post_scale_bias",
    ),
    Defect(
        "alibi_sign", "cpu", "te_fast/attention.py",
        "        return -slopes * distance",
        "        return slopes * distance",
        "ALiBi bias +slope * |i - j + off| (a reward for distance) instead of -slope * ...",
        (ATTENTION,), k="alibi",
    ),
    Defect(
        "alibi_default_scale", "cpu", "te_fast/attention.py",
        "            scores = scores * scale + self._alibi(call, q.device).to(scores.dtype)",
        "            scores = scores * qh.shape[-1] ** -0.5 + self._alibi(call, q.device).to("
        "scores.dtype)",
        "the ALiBi path scales by d ** -0.5 whatever softmax_scale the module was given",
        (ATTENTION,), k="scale or alibi",
    ),
    Defect(
        "alibi_ignores_alignment", "cpu", "te_fast/attention.py",
        "distance = self._band(call, device).abs().float()",
        "distance = self._band(call._replace(bottom_right=False), device).abs().float()",
        "ALiBi distances always top-left aligned (off = 0 even for bottom-right calls)",
        (ATTENTION, COMPILE), k="alibi",
    ),
    Defect(
        "alibi_default_slopes_odd", "cpu", "te_fast/attention.py",
        "odd = torch.arange(1, 2 * (h - n), 2, device=device, dtype=torch.float32)",
        "odd = torch.arange(2, 2 * (h - n) + 1, 2, device=device, dtype=torch.float32)",
        "default ALiBi slopes for a head count that is no power of 2 take even, not odd, terms",
        (ATTENTION, FUZZ), k="module or alibi",
    ),
    # The second slope series 2^(-8k/n) for 2^(-4k/n): in te_fast and te_ref at once it passed
    # every case that compares the two; the literal slopes catch each half (te_fast's through
    # the conformance pins, te_ref's in suites/judge/test_te_ref.py; a Defect edits one file, so
    # the halves are two defects).
    Defect(
        "alibi_second_series_8k", "cpu", "te_fast/attention.py",
        "slopes = torch.cat([slopes, torch.exp2(-4.0 * odd / n)])",
        "slopes = torch.cat([slopes, torch.exp2(-8.0 * odd / n)])",
        "default ALiBi slopes past a power of 2: second series 2^(-8k/n) for 2^(-4k/n)",
        (SEMANTICS_VALUES,), k="alibi",
    ),
    Defect(
        "te_ref_alibi_second_series_8k", "cpu", "te_ref/attention.py",
        "slopes += [2.0 ** (-4.0 * k / n) for k in range(1, 2 * (num_heads - n), 2)]",
        "slopes += [2.0 ** (-8.0 * k / n) for k in range(1, 2 * (num_heads - n), 2)]",
        "te_ref (the judge): default ALiBi slopes' second series 2^(-8k/n) for 2^(-4k/n)",
        (TE_REF_LITERALS,), k="alibi",
    ),
    Defect(
        "sink_offset_detached", "cpu", "te_fast/attention.py",
        "sink = call.softmax_offset.float().reshape(1, h, 1, 1).expand(b, h, sq, 1)",
        "sink = call.softmax_offset.detach().float().reshape(1, h, 1, 1).expand(b, h, sq, 1)",
        "learnable softmax offset detached: no gradient reaches softmax_offset",
        (ATTENTION,), k="learnable",
    ),
    Defect(
        "sink_mask_shifted", "cpu", "te_fast/attention.py",
        "probs = self._masked_softmax(ext, torch.cat([m, keep_sink], dim=-1), 1.0)",
        "probs = self._masked_softmax(ext, torch.cat([keep_sink, m], dim=-1), 1.0)",
        "sink softmax with a mask: the sink column is put first, so the mask is one column off",
        (ATTENTION,), k="off-by-one or learnable",
    ),
    Defect(
        "max_logit_unmasked", "cpu", "te_fast/attention.py",
        '            logits = logits.masked_fill(masked, float("-inf"))',
        '            logits.masked_fill(masked, float("-inf"))',
        "max_logit takes masked positions into account (the masked_fill result is dropped)",
        (ATTENTION,), k="max_logit",
    ),
    Defect(
        "padding_first_row_kept", "cpu", "te_fast/attention.py",
        "masked = (i >= call.lengths_q.view(-1, 1, 1, 1)) | (",
        "masked = (i > call.lengths_q.view(-1, 1, 1, 1)) | (",
        "padding mask off by one: the first padded query row is kept (not zero)",
        (ATTENTION,), k="padding",
    ),
    Defect(
        "window_left_off_by_one", "cpu", "te_fast/attention.py",
        "                band = band | (rel < -left)",
        "                band = band | (rel <= -left)",
        "sliding window keeps wl - 1 columns to the left instead of wl",
        (ATTENTION, COMPILE), k="win",
    ),
    Defect(
        "bottom_right_padded_offset", "cpu", "te_fast/attention.py",
        "        return j - i - (call.lengths_kv - call.lengths_q).view(-1, 1, 1, 1)",
        "        return j - i - (call.skv - call.sq)",
        "bottom-right alignment of a padded batch uses the padded, not the actual, lengths",
        (ATTENTION,), k="bottom_right",
    ),
    Defect(
        "mask_host_sync", "cpu", "te_fast/attention.py",
        "        elif call.lengths_q is not None:\n",
        "        elif call.lengths_q is not None and bool(\n"
        "            (call.lengths_q < call.sq).any() | (call.lengths_kv < call.skv).any()\n"
        "        ):  # every sequence full: no padding mask to build\n",
        "the padding mask is skipped when no sequence is padded, read with a host sync (bool())",
        (COMPILE,), k="padding",
    ),
    # ---------------------------------------------------------------- te_fast/_arguments.py
    Defect(
        "causal_window_right_unbounded", "cpu", "te_fast/_arguments.py",
        "                stacklevel=3,\n            )\n            return left, 0\n",
        "                stacklevel=3,\n            )\n            return left, right\n",
        "a causal type with window (wl, -1) or (-1, -1) keeps the given right side (TE makes it "
        "0): no causal band",
        (ATTENTION,), k="causal and win",
    ),
    Defect(
        "default_scale_uses_dv", "cpu", "te_fast/_arguments.py",
        "dqk**-0.5 if softmax_scale is None else softmax_scale",
        "dv**-0.5 if softmax_scale is None else softmax_scale",
        "the default softmax_scale is dv ** -0.5, not dqk ** -0.5 (differs for MLA)",
        (ATTENTION,), k="scale_default",
    ),
    Defect(
        "bias_dtype_unchecked", "cpu", "te_fast/_arguments.py",
        "        if bias.dtype != dtype:  # TE's fused attention: the bias has q's dtype",
        "        if False:  # TE's fused attention: the bias has q's dtype",
        "an fp32 core_attention_bias with fp16 q/k/v is taken silently (cast to fp16)",
        (BAD_INPUT,), k="bias_dtype",
    ),
    # ---------------------------------------------------------------- te_fast/attention.py
    Defect(
        "max_seqlen_error_names_q", "cpu", "te_fast/attention.py",
        "        error = max_seqlen_error(e, side)",
        '        error = max_seqlen_error(e, "q")',
        "a kv sequence longer than max_seqlen_kv is reported as max_seqlen_q's fault",
        (BAD_INPUT,), k="max_seqlen",
    ),
    # ---------------------------------------------------------------- te_fast/_attention_core.py
    Defect(
        "core_backward_unscaled", "cpu", "te_fast/_attention_core.py",
        "        ds = scores_softmax_backward(softmax, dp, p, scale)",
        "        ds = scores_softmax_backward(softmax, dp, p, 1.0)",
        "the attention core (eager and its registered backward op) drops the scale in its backward",
        ("suites/te_fast/test_eager_core.py",),
    ),
    Defect(
        "per_head_mask_first_head", "cpu", "te_fast/_attention_core.py",
        "    per_head = mask.expand(b, h, sq, skv).reshape(b * h, 1, sq, skv)",
        "    per_head = mask[:, :1].expand(b, h, sq, skv).reshape(b * h, 1, sq, skv)",
        "a per-head arbitrary mask is broadcast from head 0 over every head",
        (ATTENTION,), k="arbitrary",
    ),
    Defect(
        "core_mask_wrong_batch_slice", "cpu", "te_fast/_attention_core.py",
        "        p = scores_softmax(softmax, scores, _take(mask, axis, lo, hi), scale)",
        "        p = scores_softmax(softmax, scores, _take(mask, axis, 0, hi - lo), scale)",
        "the eager core reads the first slice's mask for every slice (batch 0's for each element)",
        ("suites/te_fast/test_dispatch_paths.py",), k="eager_core",
    ),
    # ---------------------------------------------------------------- te_fast/ops.py
    Defect(
        "fake_forward_dtype", "cpu", "te_fast/ops.py",
        "    def fake(x, scale):\n"
        '        _check_softmax_input(spec, "x", x)\n'
        "        return x.new_empty(x.shape)",
        "    def fake(x, scale):\n"
        '        _check_softmax_input(spec, "x", x)\n'
        "        return x.new_empty(x.shape, dtype=torch.float32)",
        "the softmax forward's fake says float32 whatever the input dtype",
        (CONTRACTS,), k="opcheck",
    ),
    Defect(
        "fake_thd_to_bshd_shape", "cpu", "te_fast/ops.py",
        "return thd.new_empty((batch_size, max_seqlen, thd.shape[1], thd.shape[2]))",
        "return thd.new_empty((max_seqlen, batch_size, thd.shape[1], thd.shape[2]))",
        "the fake of convert_thd_to_bshd swaps batch and sequence: [s, b, h, d]",
        (CONTRACTS,), k="opcheck and thd_to_bshd",
    ),
    Defect(
        "fake_backward_strides", "cpu", "te_fast/ops.py",
        "        return y.new_empty(y.shape)",
        "        return torch.empty_like(y)",
        "the softmax backward's fake keeps y's strides; the kernel returns a contiguous dx",
        (CONTRACTS, OP_FUZZ), k="softmax",
    ),
    Defect(
        "autograd_backward_unscaled", "cpu", "te_fast/ops.py",
        "        dx = _backward_op(spec)(grad, y, ctx.scale)",
        "        dx = _backward_op(spec)(grad, y, 1.0)",
        "the registered autograd (compile, export, opcheck) drops the softmax scale",
        (COMPILE, CONTRACTS),
    ),
    # ---------------------------------------------------------------- te_fast/fp8.py
    Defect(
        "fp8_history_newest_last", "cpu", "te_fast/fp8.py",
        "        history = torch.cat([amax.reshape(1), self.amax_history[:-1]])",
        "        history = torch.cat([self.amax_history[1:], amax.reshape(1)])",
        "FP8 amax history rolls the wrong way (newest last; most_recent reads the oldest)",
        (FP8,),
    ),
    Defect(
        "fp8_margin_inverted", "cpu", "te_fast/fp8.py",
        "        scale = torch.full_like(amax, self.fmax * 2.0**-self.margin) / amax",
        "        scale = torch.full_like(amax, self.fmax * 2.0**self.margin) / amax",
        "FP8 delayed scaling multiplies by 2**margin instead of dividing",
        (FP8,),
    ),
    Defect(
        "fp8_dp_current_scaling", "cpu", "te_fast/fp8.py",
        'ALWAYS_DELAYED = ("S", "dP")',
        'ALWAYS_DELAYED = ("S",)',
        "FP8 dP uses current scaling under CurrentScaling (its amax is not known in time)",
        (FP8,),
    ),
    Defect(
        "fp8_amax_scaled_down", "cpu", "te_fast/fp8.py",
        "        amax = torch.stack([t.detach().abs().amax().float() for t in tensors]).amax()\n",
        "        amax = torch.stack([t.detach().abs().amax().float() for t in tensors]).amax()\n"
        "        amax = amax * (1.0 if self.role == 'QKV' else 0.98)\n",
        "FP8 amax x0.98 for every role but QKV: scales 2% too large, the largest values clip",
        (FP8,),
    ),
    Defect(
        "fp8_gqa_head_mapping", "cpu", "te_fast/fp8.py",
        "t[:, :, None].expand(b, hg, h // hg, s, d).reshape(b, h, s, d)",
        "t[:, None].expand(b, h // hg, hg, s, d).reshape(b, h, s, d)",
        "FP8 with grouped heads: query head i reads kv head i % hg instead of i // (h // hg)",
        (FP8,),
    ),
    Defect(
        "fp8_output_unquantized", "cpu", "te_fast/fp8.py",
        "        return o8, o_data, o_scale_inv\n",
        "        return o, o_data, o_scale_inv\n",
        "FP8 output O returned unquantized (its amax and scale still kept)",
        (FP8,),
    ),
    # ------------------------------------------- the gates themselves (issue 35's "Why" 4 and 5)
    Defect(
        "expected_failures_loose", "cpu", "suites/expected.py",
        "    if not unexplained and not missing:\n",
        "    if True:\n",
        "an expected difference explains any failure: another tensor's or check's failure, or "
        "an exception of the run, passes as xfailed",
        ("tests/test_expected.py",),
    ),
    Defect(
        "update_baseline_accepts_loss", "cpu", "reports/__main__.py",
        "        if not accept:\n",
        "        if False:\n",
        "--update-baseline takes a run that lost coverage (passed -> skipped, cases missing) "
        "without --accept-loss, and calls it PASS",
        ("tests/test_reports_gates.py",),
    ),
    Defect(
        "passed_to_xfailed_not_a_loss", "cpu", "reports/compare.py",
        "            b.outcome == \"passed\" and n.outcome == \"xfailed\"\n",
        "            False\n",
        "a case that passed and now xfails (newly excused) is no regression against the baseline",
        ("tests/test_reports_unit.py",), k="lost_coverage",
    ),
    Defect(
        "fuzz_budget_not_compared", "cpu", "reports/compare.py",
        "            if b.examples is not None and (n.examples or 0) < b.examples:\n",
        "            if False:\n",
        "a fuzz case that draws fewer examples than its baseline (TE_FUZZ_EXAMPLES=1) passes "
        "as the same case with the same outcome",
        ("tests/test_reports_baseline.py",),
    ),
    Defect(
        "watch_skips_mask_pairs", "cpu", "suites/checks/attention.py",
        "        t for t in _tensors_of(kwargs.values())\n",
        "        t for t in kwargs.values() if isinstance(t, torch.Tensor)\n",
        "the input watch holds the call's tensors but not those inside a (q_mask, kv_mask) pair: "
        "a write to a padding mask goes unseen",
        (SELFTEST,), k="mask_pair",
    ),
    Defect(
        "k_backward_loose", "cpu", "suites/checks/numerics.py",
        "K_BACKWARD = 3.0\n",
        "K_BACKWARD = 6.0\n",
        "the gradients' k is 6, not SPEC 6's 3: a gradient off by up to 6x the composite's error "
        "passes",
        (SELFTEST,), k="k_forward",
    ),
    Defect(
        "max_logit_at_eight_ulps", "cpu", "suites/checks/numerics.py",
        "    return MAX_LOGIT_ULPS if name == \"max_logit\" else TINY_ULPS",
        "    return TINY_ULPS",
        "max_logit gets the tiny-tensor floor of 8 ulps of the case's dtype: a bf16 max_logit "
        "2% high passes",
        (SELFTEST,), k="max_logit_is_judged",
    ),
    Defect(
        "random_rounding_too_wide", "cpu", "suites/checks/rounding.py",
        "        return delta.sub_(0.5).mul_(spacing).masked_fill_(~torch.isfinite(t), 0.0)",
        "        return delta.sub_(0.5).mul_(spacing * 16).masked_fill_(~torch.isfinite(t), 0.0)",
        "the randomly rounded composites move a result by up to 8 ulps of the case's dtype, not "
        "half of one: SPEC 6's bound widens about 16-fold and values several percent off pass",
        ("suites/judge/test_rounding.py",),
    ),
    Defect(
        "fuzz_scale_not_drawn", "cpu", "suites/fuzz/strategies.py",
        "SCALE_FACTORS = (1.0, 0.37, 2.9, 0.125, 8.0)",
        "SCALE_FACTORS = (1.0,)",
        "the module fuzz draws every example at the default softmax scale d ** -0.5: a module "
        "that computes at that scale whatever it was built with passes the fuzz",
        (SELFTEST,), k="fuzz_catches_broken_module",
    ),
    Defect(
        "known_failure_any_ratio", "cpu", "suites/expected.py",
        "        if self.max_ratio is not None and failure.kind == \"ratio\":\n",
        "        if False:\n",
        "a known failure explains any size of error on its named tensor: a gradient 10x or 1e8x "
        "its bound passes as the known rounding",
        ("tests/test_expected.py",),
    ),
    Defect(
        "impl_te_fast_without_baseline", "cpu", "reports/__main__.py",
        "    named = [] if impls == [DEFAULT_IMPL] else impls\n",
        "    named = impls\n",
        "run --impl te_fast looks for a baseline of its own that does not exist, and says NO "
        "BASELINE (exit 0) where the default run's baseline would FAIL it",
        ("tests/test_reports_unit.py",), k="impl",
    ),
]  # fmt: skip

_CPP = [
    # ---------------------------------------------------------------- csrc/rules.h (shared)
    Defect(
        "causal_limit_off_by_one", "cpu", "csrc/rules.h",
        "    limit = i + 1;",
        "    limit = i;",
        "top-left causal keeps j < i: the diagonal is masked",
        (OPS,), k="upper_triang",
    ),
    Defect(
        "bottom_right_offset_sign", "cpu", "csrc/rules.h",
        "    limit = i + 1 + sk - sq;",
        "    limit = i + 1 + sq - sk;",
        "bottom-right causal shifts the diagonal by sq - sk instead of sk - sq",
        (OPS,), k="aligned_causal",
    ),
    # ---------------------------------------------------------------- csrc/eager.cpp (shared)
    Defect(
        "eager_backward_unscaled", "cpu", "csrc/eager.cpp",
        "      at::AutoDispatchBelowAutograd below;\n      dx = call_bwd(*pair, dy, y, scale);",
        "      at::AutoDispatchBelowAutograd below;\n      dx = call_bwd(*pair, dy, y, 1.0);",
        "the eager softmax backward (the C++ autograd node) drops the softmax scale",
        (ATTENTION,), k="core",
    ),
    # ---------------------------------------------------------------- csrc/te_fast.cpp (CPU)
    Defect(
        "cpu_no_max_subtraction", "cpu", "csrc/te_fast.cpp",
        "v[j] = live ? te_fast_rules::exp_shifted<kWide>(v[j], scale_d, shift) : 0.f;",
        "v[j] = live ? te_fast_rules::exp_shifted<kWide>(v[j], scale_d, 0.0) : 0.f;",
        "CPU forward without the max subtraction: exp overflows on large scores",
        (OPS,), k="large_magnitude",
    ),
    Defect(
        "cpu_fully_masked_rows_nan", "cpu", "csrc/te_fast.cpp",
        "const double inv = sum == 0.0 ? 0.0 : 1.0 / sum;  // fully masked row -> 0",
        "const double inv = 1.0 / sum;",
        "CPU forward: a fully masked row is 0 * inf = NaN, not 0",
        (OPS,), k="fully_masked",
    ),
    Defect(
        "cpu_fully_masked_rows_unwritten", "cpu", "csrc/te_fast.cpp",
        "      const double inv = sum == 0.0 ? 0.0 : 1.0 / sum;  // fully masked row -> 0\n"
        "      T* yr = y + row * g.sk;\n",
        "      if (sum == 0.0) continue;  // fully masked row: nothing to write (fresh pages: 0)\n"
        "      const double inv = 1.0 / sum;\n"
        "      T* yr = y + row * g.sk;\n",
        "CPU forward leaves a fully masked row as allocated (no 0 written): unwritten output",
        (CONTRACTS,), k="fully_written",
    ),
    Defect(
        "cpu_one_column_one_ulp_low", "cpu", "csrc/te_fast.cpp",
        "yr[j] = static_cast<T>(static_cast<float>(v[j] * inv));",
        "yr[j] = static_cast<T>(static_cast<float>(v[j] * (sum == 1.0 && "
        "std::count(on.begin(), on.end(), 1) == 1 ? 1.0 - std::numeric_limits<T>::epsilon() / 2 "
        ": inv)));",
        "CPU forward: a row with one kept column gives 1 - 1 ulp instead of exactly 1 (issue 35: "
        "the fuzz's stacked re-judging let most such draws pass; SPEC 6's tiny-tensor floor "
        "would too: an exact check catches it)",
        (OPS,), k="one_live_column",
    ),
    Defect(
        "cpu_neg_inf_scores_live", "cpu", "csrc/te_fast.cpp",
        "const bool live = on[j] && v[j] * scale != kNegInf;  // a -inf score counts as masked",
        "const bool live = on[j];",
        "CPU forward: a row of -inf scores gives exp(-inf - -inf) = NaN, not 0",
        (OPS,), k="neg_inf",
    ),
    Defect(
        "cpu_backward_unscaled", "cpu", "csrc/te_fast.cpp",
        "static_cast<float>(dyr[j]), static_cast<float>(yr[j]), dot, scale));",
        "static_cast<float>(dyr[j]), static_cast<float>(yr[j]), dot, 1.0f));",
        "CPU softmax backward drops the scale",
        (OPS,), k="test_softmax",
    ),
    Defect(
        "cpu_causal_backward_reads_whole_rows", "cpu", "csrc/te_fast.cpp",
        "      const int64_t limit = kept_prefix(mode, row % g.sq, g.sq, sk);",
        "      const int64_t limit = sk;",
        "CPU causal softmax backward reads dy and y past each row's kept prefix (SPEC §3)",
        (OPS,), k="kept_columns",
    ),
    Defect(
        "cpu_row_offset_32bit", "cpu", "csrc/te_fast.cpp",
        "      const T* xr = x + row * g.sk;",
        "      const T* xr = x + static_cast<int32_t>(row * g.sk);",
        "CPU forward computes a row's offset in 32 bits (wraps past 2^31 elements)",
        (LARGE_CPU,), k="past_2_31",
    ),
    Defect(
        "convert_trailing_not_zeroed", "cpu", "csrc/te_fast.cpp",
        "    if (!p.to_bshd && used < s.tokens) std::memset(dst + used * rb, 0, "
        "(s.tokens - used) * rb);",
        "    (void)used;  // tokens past cu_seqlens[-1] are left as allocated",
        "CPU bshd -> thd leaves the tokens past cu_seqlens[-1] unwritten",
        (CONTRACTS, OPS), k="convert",
    ),
    Defect(
        "convert_last_sequence_dropped", "cpu", "csrc/te_fast.cpp",
        "at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {",
        "at::parallel_for(0, s.batch - 1, 1, [&](int64_t begin, int64_t end) {",
        "CPU conversions skip the last sequence",
        (OPS,), k="convert",
    ),
    Defect(
        "convert_padding_off_by_one", "cpu", "csrc/te_fast.cpp",
        "std::memset(dst + padded + len * rb, 0, (s.seqlen - len) * rb);",
        "std::memset(dst + padded + len * rb, 0, (s.seqlen - len - 1) * rb);",
        "CPU thd -> bshd zeroes one padding row too few (the last stays unwritten)",
        (CONTRACTS, OPS), k="convert",
    ),
    # ---------------------------------------------------------------- csrc/op_table.h (shared)
    Defect(
        "mask_broadcast_over_batch", "cpu", "csrc/op_table.h",
        "p.mask_batch_stride = p.mask.size(0) == 1 ? 0 : p.g.sq * p.g.sk;",
        "p.mask_batch_stride = 0;",
        "a per-batch mask [b, 1, sq, sk] is read as batch 0's mask for every batch",
        (OPS,), k="batch_mask",
    ),
    Defect(
        "forward_in_place", "cpu", "csrc/op_table.h",
        "    p.y = at::empty(x.sizes(), x.options());",
        "    p.y = p.x;  // the scores are not needed afterwards: overwrite them",
        "the softmax forward writes y into x when x is contiguous (in place, aliasing)",
        (CONTRACTS,), k="alias",
    ),
    Defect(
        "backward_into_dy", "cpu", "csrc/op_table.h",
        "SoftmaxBwdPlan p{dy.contiguous(), y.contiguous(), at::empty(y.sizes(), y.options()), {}};",
        "SoftmaxBwdPlan p{dy.contiguous(), y.contiguous(), dy.contiguous(), {}};",
        "the softmax backward writes dx into dy when dy is contiguous (in place, aliasing)",
        (CONTRACTS,), k="alias",
    ),
    # ---------------------------------------------------------------- csrc/checks.h (shared)
    Defect(
        "mask_sq_unchecked", "cpu", "csrc/checks.h",
        "mask.size(1) == 1 && mask.size(2) == x.size(2) && mask.size(3) == x.size(3);",
        "mask.size(1) == 1 && mask.size(3) == x.size(3);",
        "the masked softmax accepts a mask of the wrong sq (reads past it)",
        (BAD_INPUT, OPS), k="mask",
    ),
]  # fmt: skip

_TE_FAST_CUDA = "csrc/cuda/te_fast_cuda.cpp"
_CONVERT_CU = "csrc/cuda/convert.cu"
GPU_CONTRACTS = "suites/te_fast/test_op_contracts.py"

_CUDA = [
    Defect(
        "cuda_default_stream", "cuda", _TE_FAST_CUDA,
        "    C10_CUDA_CHECK(k::launch_softmax_fwd(kernel_dtype(p.x.scalar_type()), a,\n"
        "                                         c10::cuda::getCurrentCUDAStream()));",
        "    C10_CUDA_CHECK(k::launch_softmax_fwd(kernel_dtype(p.x.scalar_type()), a,\n"
        "                                         c10::cuda::getDefaultCUDAStream()));",
        "the softmax forward launches on the default stream, not the current one",
        (GPU_CONTRACTS,), k="graph",
    ),
    Defect(
        "cuda_convert_host_sync", "cuda", _TE_FAST_CUDA,
        "  if (!debug_checks_enabled()) return;",
        "  if (false && !debug_checks_enabled()) return;  // always validate on the host",
        "CUDA conversions copy cu_seqlens to the host on every call (a host sync)",
        (OPS, GPU_CONTRACTS), k="convert",
    ),
    Defect(
        "cuda_bf16_as_fp16", "cuda", _TE_FAST_CUDA,
        "    case at::kBFloat16: return k::DType::kBFloat16;",
        "    case at::kBFloat16: return k::DType::kFloat16;",
        "bf16 softmax data dispatched to the fp16 kernels",
        (OPS,), k="test_softmax and bf16",
    ),
    Defect(
        "cuda_mask_batch_broadcast", "cuda", _TE_FAST_CUDA,
        "                              p.mask_batch_stride,\n",
        "                              0,  // one mask for every batch element\n",
        "CUDA masked softmax reads batch 0's mask for every batch element",
        (OPS,), k="batch_mask",
    ),
    Defect(
        "cuda_backward_unscaled", "cuda", _TE_FAST_CUDA,
        "                              p.g.sk,\n                              scale,\n"
        "                              mode};",
        "                              p.g.sk,\n                              1.0,\n"
        "                              mode};",
        "CUDA softmax backward drops the scale",
        (OPS,), k="test_softmax and sk1000",
    ),
    Defect(
        "cuda_convert_padding_unwritten", "cuda", _CONVERT_CU,
        "      fill_row(out, units, c.lane, U{});  // padding",
        "      (void)0;  // padding: left as allocated",
        "CUDA thd -> bshd leaves the padding rows unwritten",
        (GPU_CONTRACTS, OPS), k="convert",
    ),
    Defect(
        "cuda_convert_last_sequence", "cuda", _CONVERT_CU,
        "    int64_t hi = a.batch - 1;",
        "    int64_t hi = a.batch - 2;",
        "CUDA bshd -> thd never finds the last sequence (its tokens come out NaN)",
        (OPS,), k="convert",
    ),
    Defect(
        "cuda_convert_trailing_boundary", "cuda", _CONVERT_CU,
        "    if (r >= used) {",
        "    if (r > used) {",
        "CUDA bshd -> thd: the first token past cu_seqlens[-1] is poisoned, not zeroed",
        (OPS,), k="convert",
    ),
    Defect(
        "cuda_convert_32bit_offset", "cuda", _CONVERT_CU,
        "    U* out = c.dst + row * units;",
        "    U* out = c.dst + static_cast<int32_t>(row * units);",
        "CUDA thd -> bshd computes the output offset in 32 bits (wraps past 2^31 units)",
        ("suites/te_fast/test_large.py",), k="conversions and fp8", marker="gpu and large",
    ),
    Defect(
        "cuda_causal_backward_straddle_unmasked", "cuda", "csrc/cuda/softmax/rows.cuh",
        "        if (kept < V) {\n          g[k] = g[k].first(kept);",
        "        if (kept <= 0) {\n          g[k] = g[k].first(kept);",
        "CUDA causal backward reads the lanes past the kept prefix of a straddling chunk",
        (OPS,), k="kept_columns",
    ),
    Defect(
        "cuda_fully_masked_rows_nan", "cuda", "csrc/cuda/softmax/rows.cuh",
        "const A inv = sum == A(0) ? A(0) : A(1) / sum;  // fully masked row -> 0",
        "const A inv = A(1) / sum;",
        "CUDA register-resident forward: a fully masked row is 0 * inf = NaN, not 0",
        (OPS,), k="fully_masked",
    ),
]  # fmt: skip

DEFECTS: tuple[Defect, ...] = (*_PY, *_CPP, *_CUDA)
BY_NAME: dict[str, Defect] = {d.name: d for d in DEFECTS}

# name -> why the suites miss it. A known gap that is caught is reported, not failed. Every gap
# found so far is closed by a deterministic case in the matrices: dropout_in_eval
# (conformance/test_dropout.py), causal_kernel_alignment_swap and alias_one_token
# (test_attention.py's alignment matrix: sq = skv = 1, and every module case checks that no
# output or gradient shares storage with an input), recompile_guard_on_length
# (test_compile.py's test_dynamic_shapes: one graph over eight lengths, multiples of 32 and 64
# among them), cpu_row_offset_32bit (suites/te_fast/test_large_cpu.py: a CPU softmax past 2^31
# elements).
KNOWN_GAPS: dict[str, str] = {}
