"""Cases recorded as known failures: each fails SPEC §6's rule where named, with the diagnosis so
far. conftest.py marks them xfail (not strict): the report lists them as xfailed with this reason
(counted with the skips, never as passed), and one that passes shows as xpassed.

Add an entry only for a failure that is understood well enough to state, and name what would fix
it; never to hide a regression the gate should stop.
"""

KNOWN_FAILURES = {
    "suites/test_attention.py::test_alignment"
    "[bshd_bshd_bshd-bf16-padding-diag_br-pad_cu_seqlens-cuda-te_fast]": (
        "dk 1.02x its bound at 1 of 118272 elements on the H200 (2026-12-03; the case is new, "
        "from the alignment matrix); passes on the CPU at 0.33x, and the same shapes with other "
        "values pass on the H200 at 0.32-0.36x: not diagnosed (dk = dS^T q through cuBLAS in "
        "bf16 with the softmax backward's bf16 dS)"
    ),
    "suites/test_ops.py::test_softmax_range_end_scores"
    "[scaled_masked_softmax-bcast_mask-fp16-cuda-sk20000-scale1.0]": (
        "dx 1.54x its bound at 1 of 300000 elements on the H200 (2026-12-05 11:16, code of "
        "8dd06b2; the case's data are new that day: range-end rows at levels of their own): "
        "impl 0.351562, ref64 0.351772, ref_lp 0.351807, one fp16 ulp off where the same-precision "
        "composite is correctly rounded (the bound, 1.36e-4, is under half an ulp at 0.35). y "
        "passed. Not diagnosed: from the fp16 y and dy the backward's fp32 arithmetic cannot "
        "move dx by the 1e-4 relative it takes, so y or the dot must differ from the composite's "
        "(a row of the long kernel on one CTA whose max is held by a few columns). To diagnose: "
        "that case's seed (conftest: crc32 of the node id) on a GPU, comparing y and the dot "
        "with the composite's in the failing row. Passes on the CPU"
    ),
}
