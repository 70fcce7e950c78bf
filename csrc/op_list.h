// The te_fast ops: the one C++ list from which the TORCH_LIBRARY schemas (te_fast.cpp), the
// OpTable<Backend> entry points and their registration for every backend (op_table.h) are
// generated. Its Python counterpart is te_fast/_registry.py (OPS: the same ops in the same order,
// with the same entry, mask mode and rank; tests/test_op_table.py fails naming any difference).
// No torch headers here.
//
// TE_FAST_OPS(X) calls X(op, entry, mask_mode, rank) once per op:
//   op         the name: torch.ops.te_fast.<op>, and the op that TORCH_CHECK messages name
//   entry      the OpTable<Backend> entry point template that implements it; the op's schema is
//              the entry's, TE_FAST_SCHEMA_<entry> below
//   mask_mode  te_fast_rules::MaskMode of a softmax op: the forward's; the backward's where the
//              backward can tell the masked columns from the shape alone (the causal modes: past a
//              row's kept prefix dy and y are not read and dx is +0, docs/SPEC.md §3), kNoMask for
//              the explicitly masked backward (it takes no mask) and for the other ops
//   rank       rank of the first tensor argument: softmax 4 = [b, h, sq, sk] or
//              3 = [attn_batches, sq, sk] (the shape its messages name); conversions 3 = [t, h, d]
//              or 4 = [b, s, h, d]
// A softmax row is a pair: <name>_fwd (the given entry and mask mode) and <name>_bwd (bwd_mode).
#pragma once

// Arguments and result of each entry point, as TORCH_LIBRARY defines them after the op's name.
// (torch checks at registration that the entry point's C++ signature matches.)
#define TE_FAST_SCHEMA_softmax_fwd "(Tensor x, float scale) -> Tensor"
#define TE_FAST_SCHEMA_masked_softmax_fwd "(Tensor x, Tensor mask, float scale) -> Tensor"
#define TE_FAST_SCHEMA_softmax_bwd "(Tensor dy, Tensor y, float scale) -> Tensor"
#define TE_FAST_SCHEMA_thd_to_bshd \
  "(Tensor thd, Tensor cu_seqlens, SymInt batch_size, SymInt max_seqlen) -> Tensor"
#define TE_FAST_SCHEMA_bshd_to_thd "(Tensor bshd, Tensor cu_seqlens, SymInt num_tokens) -> Tensor"

// clang-format off
#define TE_FAST_OPS(X)                                                                            \
  TE_FAST_SOFTMAX(X, scaled_softmax, softmax_fwd, kNoMask, kNoMask, 4)                            \
  TE_FAST_SOFTMAX(X, scaled_masked_softmax, masked_softmax_fwd, kExplicitMask, kNoMask, 4)        \
  TE_FAST_SOFTMAX(X, scaled_upper_triang_masked_softmax, softmax_fwd, kTopLeftCausal,             \
                  kTopLeftCausal, 3)                                                              \
  TE_FAST_SOFTMAX(X, scaled_aligned_causal_masked_softmax, softmax_fwd, kBottomRightCausal,       \
                  kBottomRightCausal, 4)                                                          \
  X(convert_thd_to_bshd, thd_to_bshd, kNoMask, 3)                                                 \
  X(convert_bshd_to_thd, bshd_to_thd, kNoMask, 4)

#define TE_FAST_SOFTMAX(X, name, fwd_entry, mask_mode, bwd_mode, rank)                            \
  X(name##_fwd, fwd_entry, mask_mode, rank)                                                       \
  X(name##_bwd, softmax_bwd, bwd_mode, rank)
// clang-format on
