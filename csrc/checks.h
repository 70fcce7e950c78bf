// Argument checks shared by the CPU and CUDA implementations. Every message names the op,
// the argument and what was expected, so a user can act on it.
#pragma once

#include <torch/library.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "rules.h"

namespace te_fast {

inline bool is_softmax_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

inline bool is_storage_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble ||
         t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

// x: the scores of a softmax op; `layout` is the expected shape in words, `dim` its rank.
inline void check_softmax_input(const char* op, const char* name, const at::Tensor& x, int64_t dim,
                                const char* layout) {
  TORCH_CHECK(x.dim() == dim, "te_fast: ", op, " expects ", name, " of shape ", layout, " (", dim,
              "-D), got a ", x.dim(), "-D tensor of shape ", x.sizes());
  TORCH_CHECK(is_softmax_dtype(x.scalar_type()), "te_fast: ", op, " expects ", name,
              " of dtype float16, bfloat16 or float32, got ", x.scalar_type());
}

inline void check_softmax_bwd(const char* op, const at::Tensor& dy, const at::Tensor& y,
                              int64_t dim, const char* layout) {
  check_softmax_input(op, "y", y, dim, layout);
  TORCH_CHECK(dy.sizes() == y.sizes(), "te_fast: ", op, " expects dy of the same shape as y ",
              y.sizes(), ", got ", dy.sizes());
  TORCH_CHECK(dy.scalar_type() == y.scalar_type(), "te_fast: ", op,
              " expects dy of the same dtype as y (", y.scalar_type(), "), got ",
              dy.scalar_type());
  TORCH_CHECK(dy.device() == y.device(), "te_fast: ", op, " expects dy and y on one device, got ",
              dy.device(), " and ", y.device());
}

inline void check_softmax_mask(const char* op, const at::Tensor& x, const at::Tensor& mask) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "te_fast: ", op,
              " expects mask of dtype bool (True = masked out), got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == x.device(), "te_fast: ", op, " expects mask on ", x.device(),
              " like x, got ", mask.device());
  const bool ok = mask.dim() == 4 && (mask.size(0) == 1 || mask.size(0) == x.size(0)) &&
                  mask.size(1) == 1 && mask.size(2) == x.size(2) && mask.size(3) == x.size(3);
  TORCH_CHECK(ok, "te_fast: ", op, " expects mask of shape [1|b, 1, sq, sk] = [1|", x.size(0),
              ", 1, ", x.size(2), ", ", x.size(3), "] for x of shape ", x.sizes(), ", got ",
              mask.sizes());
}

inline void check_cu_seqlens(const char* op, const at::Tensor& data, const at::Tensor& cu) {
  TORCH_CHECK(cu.scalar_type() == at::kInt, "te_fast: ", op,
              " expects cu_seqlens of dtype int32, got ", cu.scalar_type());
  TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 1, "te_fast: ", op,
              " expects cu_seqlens of shape [batch_size + 1], got ", cu.sizes());
  TORCH_CHECK(cu.device() == data.device(), "te_fast: ", op, " expects cu_seqlens on ",
              data.device(), " like the data, got ", cu.device());
}

inline void check_storage(const char* op, const char* name, const at::Tensor& t, int64_t dim,
                          const char* layout) {
  TORCH_CHECK(t.dim() == dim, "te_fast: ", op, " expects ", name, " of shape ", layout,
              ", got a ", t.dim(), "-D tensor of shape ", t.sizes());
  TORCH_CHECK(is_storage_dtype(t.scalar_type()), "te_fast: ", op, " expects ", name,
              " of a float dtype (float32/16, bfloat16, float64, float8_e4m3fn, float8_e5m2), got ",
              t.scalar_type());
}

// Full host-side validation of cu_seqlens values (the same rule the kernels apply per sequence).
inline void validate_cu_seqlens_values(const char* op, const int32_t* cu, int64_t batch,
                                       int64_t num_tokens, const char* tokens_name,
                                       int64_t max_len, const char* max_len_name) {
  TORCH_CHECK(cu[0] == 0, "te_fast: ", op, " expects cu_seqlens[0] == 0, got ", cu[0]);
  for (int64_t x = 0; x < batch; ++x) {
    if (te_fast_rules::sequence_ok(cu, x, num_tokens, max_len)) continue;
    const int64_t start = cu[x];
    const int64_t end = cu[x + 1];
    TORCH_CHECK(end >= start, "te_fast: ", op, " expects non-decreasing cu_seqlens, got cu_seqlens[",
                x, "] = ", start, " > cu_seqlens[", x + 1, "] = ", end);
    TORCH_CHECK(end - start <= max_len, "te_fast: ", op, ": sequence ", x, " has length ",
                end - start, " > ", max_len_name, " = ", max_len);
    TORCH_CHECK(false, "te_fast: ", op, ": cu_seqlens[", x + 1, "] = ", end, " is past ",
                tokens_name, " = ", num_tokens);
  }
}

// CUDA kernels never read out of bounds on bad cu_seqlens (they write NaN into the affected
// sequences instead, with no host sync). Setting TE_FAST_DEBUG_CHECKS=1 turns on the host-side
// validation there too, at the cost of a device-to-host copy per call (not capturable).
inline bool debug_checks_enabled() {
  const char* v = std::getenv("TE_FAST_DEBUG_CHECKS");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

}  // namespace te_fast

namespace te_fast {

// Rows of a softmax op: [b, h, sq, sk] (4-D ops) or [attn_batches, sq, sk] (upper-triangular op).
struct RowGeometry {
  int64_t rows;
  int64_t sq;
  int64_t sk;
  int64_t heads;  // rows of one batch element = heads * sq (explicit masks are per batch element)
};

inline RowGeometry row_geometry(const at::Tensor& x) {
  const int64_t d = x.dim();
  const int64_t sq = x.size(d - 2);
  const int64_t sk = x.size(d - 1);
  const int64_t heads = d == 4 ? x.size(1) : 1;
  return {sk == 0 ? 0 : x.numel() / sk, sq, sk, heads};
}

}  // namespace te_fast

namespace te_fast {

struct ConvertShape {
  int64_t batch;
  int64_t seqlen;  // padded length of the bshd side
  int64_t tokens;  // rows of the thd side
  int64_t heads;
  int64_t dim;
  int64_t row_bytes;  // bytes of one token row (heads * dim elements)
};

inline ConvertShape check_thd_to_bshd(const char* op, const at::Tensor& thd, const at::Tensor& cu,
                                      int64_t batch_size, int64_t max_seqlen) {
  check_storage(op, "thd", thd, 3, "[t, h, d]");
  check_cu_seqlens(op, thd, cu);
  TORCH_CHECK(batch_size >= 0 && max_seqlen >= 0, "te_fast: ", op,
              " expects batch_size >= 0 and max_seqlen >= 0, got ", batch_size, " and ",
              max_seqlen);
  TORCH_CHECK(cu.size(0) == batch_size + 1, "te_fast: ", op,
              " expects cu_seqlens of shape [batch_size + 1] = [", batch_size + 1, "], got ",
              cu.sizes());
  return {batch_size, max_seqlen, thd.size(0), thd.size(1), thd.size(2),
          thd.size(1) * thd.size(2) * static_cast<int64_t>(thd.element_size())};
}

inline ConvertShape check_bshd_to_thd(const char* op, const at::Tensor& bshd, const at::Tensor& cu,
                                      int64_t num_tokens) {
  check_storage(op, "bshd", bshd, 4, "[b, s, h, d]");
  check_cu_seqlens(op, bshd, cu);
  TORCH_CHECK(num_tokens >= 0, "te_fast: ", op, " expects num_tokens >= 0, got ", num_tokens);
  TORCH_CHECK(cu.size(0) == bshd.size(0) + 1, "te_fast: ", op,
              " expects cu_seqlens of shape [b + 1] = [", bshd.size(0) + 1, "] for bshd of shape ",
              bshd.sizes(), ", got ", cu.sizes());
  return {bshd.size(0), bshd.size(1), num_tokens, bshd.size(2), bshd.size(3),
          bshd.size(2) * bshd.size(3) * static_cast<int64_t>(bshd.element_size())};
}

}  // namespace te_fast
