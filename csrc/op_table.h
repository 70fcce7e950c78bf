// The entry points of the ops in op_list.h, written once for every backend. A backend supplies
// three kernels (softmax forward and backward over prepared rows, and the token-row copy of the
// THD <-> BSHD conversions); the argument checks, contiguity, output allocation and
// registration are shared here.
#pragma once

#include <torch/library.h>

#include "checks.h"
#include "op_list.h"
#include "rules.h"

namespace te_fast {

struct SoftmaxFwdPlan {
  at::Tensor x;     // contiguous
  at::Tensor mask;  // contiguous or undefined
  int64_t mask_batch_stride;
  at::Tensor y;  // fresh, contiguous
  RowGeometry g;
};

struct SoftmaxBwdPlan {
  at::Tensor dy;  // contiguous
  at::Tensor y;   // contiguous
  at::Tensor dx;  // fresh, contiguous
  RowGeometry g;
};

// A THD <-> BSHD conversion, checked and allocated: what a backend's convert kernel needs.
struct ConvertPlan {
  const char* op;
  bool to_bshd;     // thd -> bshd (zero padding); else bshd -> thd (zero trailing tokens)
  at::Tensor src;   // contiguous
  at::Tensor cu;    // contiguous, int32 [batch + 1]
  at::Tensor out;   // fresh, contiguous
  ConvertShape s;
  const char* tokens_name;  // how messages call s.tokens and s.seqlen: the op's own arguments
  const char* seqlen_name;
};

// Full validation of cu_seqlens values that are on the host.
inline void validate_cu_seqlens(const ConvertPlan& p, const int32_t* host_cu) {
  validate_cu_seqlens_values(p.op, host_cu, p.s.batch, p.s.tokens, p.tokens_name, p.s.seqlen,
                             p.seqlen_name);
}

// One tag type per op of TE_FAST_OPS, named like the op: what its entry point needs to know.
namespace op {
#define TE_FAST_TAG(op_, entry_, mask_mode_, rank_)              \
  struct op_ {                                                   \
    static constexpr const char* name = #op_;                    \
    static constexpr int mask_mode = te_fast_rules::mask_mode_;  \
    static constexpr int64_t rank = rank_;                       \
  };
TE_FAST_OPS(TE_FAST_TAG)
#undef TE_FAST_TAG
}  // namespace op

// The shape a softmax op's messages name for its rank.
inline const char* softmax_layout(int64_t rank) {
  return rank == 3 ? "[attn_batches, sq, sk]" : "[b, h, sq, sk]";
}

template <typename Backend>
struct OpTable {
  // Shared by the softmax entry points: checks, contiguous inputs, a fresh output, the kernel.
  static at::Tensor run_softmax_fwd(const char* op, const at::Tensor& x, const at::Tensor* mask,
                                    double scale, int mode, int64_t dim) {
    check_softmax_input(op, "x", x, dim, softmax_layout(dim));
    if (mask != nullptr) check_softmax_mask(op, x, *mask);
    SoftmaxFwdPlan p;
    p.x = x.contiguous();
    p.y = at::empty(x.sizes(), x.options());
    p.g = row_geometry(p.x);
    p.mask_batch_stride = 0;
    if (mask != nullptr) {
      p.mask = mask->contiguous();
      p.mask_batch_stride = p.mask.size(0) == 1 ? 0 : p.g.sq * p.g.sk;
    }
    if (p.g.rows > 0) Backend::softmax_fwd(p, scale, mode);
    return p.y;
  }

  // mode: the backward's MaskMode (op_list.h): a causal mode reads only each row's kept prefix
  // of dy and y and writes +0 past it; kNoMask, the whole row.
  static at::Tensor run_softmax_bwd(const char* op, const at::Tensor& dy, const at::Tensor& y,
                                    double scale, int mode, int64_t dim) {
    check_softmax_bwd(op, dy, y, dim, softmax_layout(dim));
    SoftmaxBwdPlan p{dy.contiguous(), y.contiguous(), at::empty(y.sizes(), y.options()), {}};
    p.g = row_geometry(p.y);
    if (p.g.rows > 0) Backend::softmax_bwd(p, scale, mode);
    return p.dx;
  }

  // ---- the entry points: one template per `entry` of TE_FAST_OPS; Op is the op's tag

  template <class Op>
  static at::Tensor softmax_fwd(const at::Tensor& x, double scale) {
    return run_softmax_fwd(Op::name, x, nullptr, scale, Op::mask_mode, Op::rank);
  }

  template <class Op>
  static at::Tensor masked_softmax_fwd(const at::Tensor& x, const at::Tensor& mask, double scale) {
    return run_softmax_fwd(Op::name, x, &mask, scale, Op::mask_mode, Op::rank);
  }

  template <class Op>
  static at::Tensor softmax_bwd(const at::Tensor& dy, const at::Tensor& y, double scale) {
    return run_softmax_bwd(Op::name, dy, y, scale, Op::mask_mode, Op::rank);
  }

  template <class Op>
  static at::Tensor thd_to_bshd(const at::Tensor& thd, const at::Tensor& cu_seqlens,
                                int64_t batch_size, int64_t max_seqlen) {
    const ConvertShape s = check_thd_to_bshd(Op::name, thd, cu_seqlens, batch_size, max_seqlen);
    ConvertPlan p{Op::name, true, thd.contiguous(), cu_seqlens.contiguous(), {}, s,
                  "thd.shape[0]", "max_seqlen"};
    p.out = at::empty({batch_size, max_seqlen, s.heads, s.dim}, thd.options());
    Backend::convert(p);  // an empty output too: the backend still validates cu_seqlens
    return p.out;
  }

  template <class Op>
  static at::Tensor bshd_to_thd(const at::Tensor& bshd, const at::Tensor& cu_seqlens,
                                int64_t num_tokens) {
    const ConvertShape s = check_bshd_to_thd(Op::name, bshd, cu_seqlens, num_tokens);
    ConvertPlan p{Op::name, false, bshd.contiguous(), cu_seqlens.contiguous(), {}, s,
                  "num_tokens", "bshd.shape[1]"};
    p.out = at::empty({num_tokens, s.heads, s.dim}, bshd.options());
    Backend::convert(p);  // an empty output too: the backend still validates cu_seqlens
    return p.out;
  }

  static void register_all(torch::Library& m) {
#define TE_FAST_IMPL(op_, entry_, mask_mode_, rank_) m.impl(#op_, &entry_<op::op_>);
    TE_FAST_OPS(TE_FAST_IMPL)
#undef TE_FAST_IMPL
  }
};

}  // namespace te_fast
