// The ten op entry points, written once for every backend. A backend supplies the four kernels
// (softmax forward/backward over prepared rows, and the two token-row copies); the argument
// checks, contiguity, output allocation and registration are shared here.
#pragma once

#include <torch/library.h>

#include "checks.h"
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

template <typename Backend>
struct OpTable {
  static at::Tensor softmax_fwd(const char* op, const at::Tensor& x, const at::Tensor* mask,
                                double scale, int mode, int64_t dim, const char* layout) {
    check_softmax_input(op, "x", x, dim, layout);
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
    if (p.g.rows > 0) Backend::softmax_fwd(p, static_cast<float>(scale), mode);
    return p.y;
  }

  static at::Tensor softmax_bwd(const char* op, const at::Tensor& dy, const at::Tensor& y,
                                double scale, int64_t dim, const char* layout) {
    check_softmax_bwd(op, dy, y, dim, layout);
    SoftmaxBwdPlan p{dy.contiguous(), y.contiguous(), at::empty(y.sizes(), y.options()), {}};
    p.g = row_geometry(p.y);
    if (p.g.rows > 0) Backend::softmax_bwd(p, static_cast<float>(scale));
    return p.dx;
  }

  static constexpr const char* k4d = "[b, h, sq, sk]";
  static constexpr const char* k3d = "[attn_batches, sq, sk]";

  static at::Tensor scaled_softmax_fwd(const at::Tensor& x, double scale) {
    return softmax_fwd("scaled_softmax_fwd", x, nullptr, scale, te_fast_rules::kNoMask, 4, k4d);
  }
  static at::Tensor scaled_softmax_bwd(const at::Tensor& dy, const at::Tensor& y, double scale) {
    return softmax_bwd("scaled_softmax_bwd", dy, y, scale, 4, k4d);
  }
  static at::Tensor scaled_masked_softmax_fwd(const at::Tensor& x, const at::Tensor& mask,
                                              double scale) {
    return softmax_fwd("scaled_masked_softmax_fwd", x, &mask, scale, te_fast_rules::kExplicitMask,
                       4, k4d);
  }
  static at::Tensor scaled_masked_softmax_bwd(const at::Tensor& dy, const at::Tensor& y,
                                              double scale) {
    return softmax_bwd("scaled_masked_softmax_bwd", dy, y, scale, 4, k4d);
  }
  static at::Tensor scaled_upper_triang_masked_softmax_fwd(const at::Tensor& x, double scale) {
    return softmax_fwd("scaled_upper_triang_masked_softmax_fwd", x, nullptr, scale,
                       te_fast_rules::kTopLeftCausal, 3, k3d);
  }
  static at::Tensor scaled_upper_triang_masked_softmax_bwd(const at::Tensor& dy,
                                                           const at::Tensor& y, double scale) {
    return softmax_bwd("scaled_upper_triang_masked_softmax_bwd", dy, y, scale, 3, k3d);
  }
  static at::Tensor scaled_aligned_causal_masked_softmax_fwd(const at::Tensor& x, double scale) {
    return softmax_fwd("scaled_aligned_causal_masked_softmax_fwd", x, nullptr, scale,
                       te_fast_rules::kBottomRightCausal, 4, k4d);
  }
  static at::Tensor scaled_aligned_causal_masked_softmax_bwd(const at::Tensor& dy,
                                                             const at::Tensor& y, double scale) {
    return softmax_bwd("scaled_aligned_causal_masked_softmax_bwd", dy, y, scale, 4, k4d);
  }

  static at::Tensor convert_thd_to_bshd(const at::Tensor& thd, const at::Tensor& cu_seqlens,
                                        int64_t batch_size, int64_t max_seqlen) {
    const char* op = "convert_thd_to_bshd";
    const ConvertShape s = check_thd_to_bshd(op, thd, cu_seqlens, batch_size, max_seqlen);
    const at::Tensor src = thd.contiguous();
    const at::Tensor cu = cu_seqlens.contiguous();
    at::Tensor out = at::empty({batch_size, max_seqlen, s.heads, s.dim}, thd.options());
    if (batch_size > 0) Backend::thd_to_bshd(op, src, cu, out, s);
    return out;
  }

  static at::Tensor convert_bshd_to_thd(const at::Tensor& bshd, const at::Tensor& cu_seqlens,
                                        int64_t num_tokens) {
    const char* op = "convert_bshd_to_thd";
    const ConvertShape s = check_bshd_to_thd(op, bshd, cu_seqlens, num_tokens);
    const at::Tensor src = bshd.contiguous();
    const at::Tensor cu = cu_seqlens.contiguous();
    at::Tensor out = at::empty({num_tokens, s.heads, s.dim}, bshd.options());
    if (num_tokens > 0) Backend::bshd_to_thd(op, src, cu, out, s);
    return out;
  }

  static void register_all(torch::Library& m) {
    m.impl("scaled_softmax_fwd", &scaled_softmax_fwd);
    m.impl("scaled_softmax_bwd", &scaled_softmax_bwd);
    m.impl("scaled_masked_softmax_fwd", &scaled_masked_softmax_fwd);
    m.impl("scaled_masked_softmax_bwd", &scaled_masked_softmax_bwd);
    m.impl("scaled_upper_triang_masked_softmax_fwd", &scaled_upper_triang_masked_softmax_fwd);
    m.impl("scaled_upper_triang_masked_softmax_bwd", &scaled_upper_triang_masked_softmax_bwd);
    m.impl("scaled_aligned_causal_masked_softmax_fwd", &scaled_aligned_causal_masked_softmax_fwd);
    m.impl("scaled_aligned_causal_masked_softmax_bwd", &scaled_aligned_causal_masked_softmax_bwd);
    m.impl("convert_thd_to_bshd", &convert_thd_to_bshd);
    m.impl("convert_bshd_to_thd", &convert_bshd_to_thd);
  }
};

}  // namespace te_fast
