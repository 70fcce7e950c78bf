// The per-row and per-sequence rules shared by the CPU kernels and the CUDA kernels.
// Pure C++ (no torch headers) so that plain nvcc can compile the CUDA side.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define TE_HD __host__ __device__ __forceinline__
#else
#define TE_HD inline
#endif

namespace te_fast_rules {

// Which columns of a softmax row may be kept (before an explicit mask is applied).
enum MaskMode : int {
  kNoMask = 0,
  kExplicitMask = 1,       // bool mask [1|b, 1, sq, sk], True = masked out
  kTopLeftCausal = 2,      // keep j <= i
  kBottomRightCausal = 3,  // keep j <= i + (sk - sq)
};

// Columns j < kept_prefix(...) may be kept; columns at or past it are masked.
TE_HD int64_t kept_prefix(int mode, int64_t i, int64_t sq, int64_t sk) {
  int64_t limit = sk;
  if (mode == kTopLeftCausal) {
    limit = i + 1;
  } else if (mode == kBottomRightCausal) {
    limit = i + 1 + sk - sq;
  }
  return limit < 0 ? 0 : (limit > sk ? sk : limit);
}

// exp(scale * x - m) for one kept column, where m is the row's (running) max of scale * x as the
// kernel forms the argument: fl(scale * x) in fp32 for fp16/bf16 data; in double for fp32 data
// (kWide), so that no argument exceeds 0. (Softmax is shift-invariant, but a shift taken from
// the fp32 product while the argument takes the double one is off by up to 2^-24 of the largest
// score: harmless at everyday magnitudes, a NaN or zero row where scores reach ~1e9 / scale at
// a scale that fp32 does not hold exactly, such as an additive finfo(float32).min mask before a
// scale of 1/sqrt(d); the fuzz's range-end scores found it.) With fp32 data the
// product and the difference are formed in double, where both are exact or nearly so, and only
// the small difference is rounded to fp32: rounding scale * x to fp32 first would cost up to half
// an ulp of the score, which at a score of 6 is 2.4e-7 of every probability, the largest error of
// the whole softmax and one that an fp32 composite shares. The scale is the op's own double (0.6,
// not 0.6f, whose rounding is 4e-8 of every score: for fp32 data that was the largest error
// left, and it put test_softmax_misaligned_views[fp32-cuda-sk1000]'s dx over its bound). The
// exponential itself is fp32's expf: a double exp cost the fp32 forward about a third of its
// speed for error ratios the scale alone had already brought down. fp16/bf16 data work in fp32:
// their output rounding is 2^13 times coarser than all of this.
//
// The product is rounded before the difference (the _rn intrinsics on the device, which nvcc
// never fuses): at the max, the argument is then exactly 0 by construction. A fused multiply-add
// (nvcc contracts x * scale - m to one by default) gives the product's own rounding error
// instead, which at scores near the type's range ends is ~1e22 (double) and made the CUDA fp32
// rows NaN or 0 at a scale of 0.7 (test_softmax_range_end_scores). The CPU
// build passes -ffp-contract=off for the same reason (setup.py).
template <bool kWide>
TE_HD float exp_shifted(float x, double scale, double m) {
#if defined(__CUDA_ARCH__)
  if (kWide) return expf(static_cast<float>(__dmul_rn(static_cast<double>(x), scale) - m));
  return expf(__fmul_rn(x, static_cast<float>(scale)) - static_cast<float>(m));
#else
  if (kWide) return expf(static_cast<float>(static_cast<double>(x) * scale - m));
  return expf(x * static_cast<float>(scale) - static_cast<float>(m));
#endif
}

// The softmax backward, dx = scale * y * (dy - dot) with dot = sum_j y_j * dy_j, one element at
// a time. fp32 data (kWide) form the products, the sum and the element in double and round once:
// where one probability is near 1, dy - dot cancels (dx is (1 - y) times smaller than dy * y),
// and a dot or a product rounded to fp32 first costs half an ulp of dy * y in that small result.
// (Found by the fuzz suite: a sink softmax row with one kept key, y = 0.94, gave
// dk 7 ulp off where the CUDA composite was exact.) fp16/bf16 work in fp32: their output
// rounding is 2^13 times coarser.
template <bool kWide>
using BwdAcc = typename std::conditional<kWide, double, float>::type;

template <bool kWide>
TE_HD BwdAcc<kWide> bwd_product(float dy, float y) {
  return static_cast<BwdAcc<kWide>>(dy) * static_cast<BwdAcc<kWide>>(y);
}

template <bool kWide>
TE_HD float bwd_element(float dy, float y, BwdAcc<kWide> dot, double scale) {
  using A = BwdAcc<kWide>;
  return static_cast<float>(static_cast<A>(scale) * static_cast<A>(y) * (static_cast<A>(dy) - dot));
}

// A sequence x of cu_seqlens is usable when it starts at or after 0 with cu_seqlens[0] == 0,
// has non-negative length no longer than max_len, and ends inside the token buffer.
// Every kernel checks exactly this before touching memory, so bad values never read out of
// bounds; the host-side validation reports the first violation of the same rule.
TE_HD bool sequence_ok(const int32_t* cu, int64_t x, int64_t num_tokens, int64_t max_len) {
  const int64_t start = cu[x];
  const int64_t end = cu[x + 1];
  return cu[0] == 0 && start >= 0 && end >= start && end <= num_tokens && end - start <= max_len;
}

}  // namespace te_fast_rules
