// te_fast operator schemas (from the one list in op_list.h) and their CPU implementations.
#include <Python.h>

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "op_list.h"
#include "op_table.h"
#include "rules.h"

// A dummy module init so that `from te_fast import _C` loads this library (and with it the
// TORCH_LIBRARY registrations below); no pybind11 is needed.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

// One m.def per op of op_list.h, e.g. "scaled_softmax_fwd(Tensor x, float scale) -> Tensor".
TORCH_LIBRARY(te_fast, m) {
#define TE_FAST_DEF(op_, entry_, mask_mode_, rank_) m.def(#op_ TE_FAST_SCHEMA_##entry_);
  TE_FAST_OPS(TE_FAST_DEF)
#undef TE_FAST_DEF
}

namespace te_fast {
namespace {

using te_fast_rules::kept_prefix;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// kAccumulateNote: elements are computed in fp32, row sums are accumulated in double (CPU and
// CUDA alike). With fp32 inputs a sequential fp32 sum drifts by ~n ulp and would dominate the
// error; the kernels are memory-bound, so the wider adds cost nothing measurable. For fp32 data
// the exp argument is formed in double as well (te_fast_rules::exp_shifted).

template <typename T>
void softmax_fwd_rows(const T* x, const bool* mask, int64_t mask_batch_stride, T* y,
                      const RowGeometry& g, double scale_d, int mode) {
  constexpr bool kWide = std::is_same<T, float>::value;
  const float scale = static_cast<float>(scale_d);  // the max and the -inf test; exp takes scale_d
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(g.sk, 1));
  at::parallel_for(0, g.rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> v(g.sk);   // raw x, then exp(scale * x - max)
    std::vector<uint8_t> on(g.sk);  // column kept
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % g.sq;
      const int64_t limit = kept_prefix(mode, i, g.sq, g.sk);
      const T* xr = x + row * g.sk;
      const bool* m = mode == te_fast_rules::kExplicitMask
                          ? mask + (row / (g.heads * g.sq)) * mask_batch_stride + i * g.sk
                          : nullptr;
      // The exponent's shift: the max over kept columns of scale * x as exp_shifted forms it,
      // fl(scale * x) for fp16/bf16 data, in double for fp32 data (te_fast_rules says why).
      double shift = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < g.sk; ++j) {
        on[j] = j < limit && (m == nullptr || !m[j]);
        v[j] = static_cast<float>(xr[j]);
        if (on[j]) {
          shift = std::fmax(shift, kWide ? static_cast<double>(v[j]) * scale_d : v[j] * scale);
        }
      }
      double sum = 0.0;  // see kAccumulateNote
      for (int64_t j = 0; j < g.sk; ++j) {
        const bool live = on[j] && v[j] * scale != kNegInf;  // a -inf score counts as masked
        v[j] = live ? te_fast_rules::exp_shifted<kWide>(v[j], scale_d, shift) : 0.f;
        sum += v[j];
      }
      const double inv = sum == 0.0 ? 0.0 : 1.0 / sum;  // fully masked row -> 0
      T* yr = y + row * g.sk;
      for (int64_t j = 0; j < g.sk; ++j) {
        yr[j] = static_cast<T>(static_cast<float>(v[j] * inv));
      }
    }
  });
}

// dx = scale * y * (dy - dot), dot = sum_j dy_j * y_j, over columns j < kept_prefix(mode, i):
// under a causal mode the columns past a row's kept prefix are not read (dy and y there may hold
// anything) and dx there is +0 (docs/SPEC.md §3); kNoMask keeps the whole row.
template <typename T>
void softmax_bwd_rows(const T* dy, const T* y, T* dx, const RowGeometry& g, double scale,
                      int mode) {
  constexpr bool kWide = std::is_same<T, float>::value;
  const int64_t sk = g.sk;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(sk, 1));
  at::parallel_for(0, g.rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t limit = kept_prefix(mode, row % g.sq, g.sq, sk);
      const T* dyr = dy + row * sk;
      const T* yr = y + row * sk;
      double acc = 0.0;  // see kAccumulateNote; te_fast_rules::bwd_element for fp32's double
      for (int64_t j = 0; j < limit; ++j) {
        acc += te_fast_rules::bwd_product<kWide>(static_cast<float>(dyr[j]),
                                                 static_cast<float>(yr[j]));
      }
      const auto dot = static_cast<te_fast_rules::BwdAcc<kWide>>(acc);
      T* dxr = dx + row * sk;
      for (int64_t j = 0; j < limit; ++j) {
        dxr[j] = static_cast<T>(te_fast_rules::bwd_element<kWide>(
            static_cast<float>(dyr[j]), static_cast<float>(yr[j]), dot, scale));
      }
      std::fill(dxr + limit, dxr + sk, static_cast<T>(0.f));
    }
  });
}

// The CPU backend of OpTable: rows in parallel with at::parallel_for, fp32 accumulation.
struct CpuBackend {
  static void softmax_fwd(const SoftmaxFwdPlan& p, double scale, int mode) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.x.scalar_type(), "softmax_fwd_cpu", [&] {
      softmax_fwd_rows<scalar_t>(p.x.const_data_ptr<scalar_t>(),
                                 p.mask.defined() ? p.mask.const_data_ptr<bool>() : nullptr,
                                 p.mask_batch_stride, p.y.mutable_data_ptr<scalar_t>(), p.g, scale,
                                 mode);
    });
  }

  static void softmax_bwd(const SoftmaxBwdPlan& p, double scale, int mode) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.y.scalar_type(), "softmax_bwd_cpu", [&] {
      softmax_bwd_rows<scalar_t>(p.dy.const_data_ptr<scalar_t>(), p.y.const_data_ptr<scalar_t>(),
                                 p.dx.mutable_data_ptr<scalar_t>(), p.g, scale, mode);
    });
  }

  // Token rows are copied as bytes: one code path for every storage dtype, fp8 included, and
  // all-zero bytes are 0.0 in each of them. Sequence x is rows cu[x] .. cu[x + 1] of the thd
  // side and the first rows of block x (max_seqlen rows) of the bshd side.
  static void convert(const ConvertPlan& p) {
    const int32_t* c = p.cu.const_data_ptr<int32_t>();
    validate_cu_seqlens(p, c);
    const ConvertShape& s = p.s;
    const int64_t rb = s.row_bytes;
    if (p.out.numel() == 0) return;  // validated; nothing to copy (dst may be null)
    const char* src = static_cast<const char*>(p.src.const_data_ptr());
    char* dst = static_cast<char*>(p.out.mutable_data_ptr());
    at::parallel_for(0, s.batch, 1, [&](int64_t begin, int64_t end) {
      for (int64_t x = begin; x < end; ++x) {
        const int64_t len = c[x + 1] - c[x];
        const int64_t ragged = static_cast<int64_t>(c[x]) * rb;  // byte offset on the thd side
        const int64_t padded = x * s.seqlen * rb;                 // byte offset on the bshd side
        if (len > 0) {
          std::memcpy(dst + (p.to_bshd ? padded : ragged), src + (p.to_bshd ? ragged : padded),
                      len * rb);
        }
        if (p.to_bshd && len < s.seqlen) {
          std::memset(dst + padded + len * rb, 0, (s.seqlen - len) * rb);
        }
      }
    });
    const int64_t used = c[s.batch];  // bshd -> thd: tokens past cu_seqlens[-1] are zero
    if (!p.to_bshd && used < s.tokens) std::memset(dst + used * rb, 0, (s.tokens - used) * rb);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(te_fast, CPU, m) { OpTable<CpuBackend>::register_all(m); }

}  // namespace te_fast
