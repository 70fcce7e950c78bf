// The softmax kernels' common ground: constants, the per-dtype types (the sum's type, a 16-byte
// chunk of V elements and its load and store), where a row sits (RowPos), and the arithmetic of
// one element: the exponential e = exp(scale * x - max) in each dtype's form and the final
// scaling y = e * (1 / sum) (TimesInv).
//
// Precision. fp16/bf16: the exponent works in base 2 with the scale folded in,
// exp2(fma(x, scale * log2 e, -max)) with the hardware's ex2 (relative error about 2^-22), in
// fp32, and the sums are fp32 (forward_row, rows.cuh, says more). fp32 data keep the accurate
// expf of an argument formed in double from the op's double scale, less the row's max of the same
// double product (te_fast_rules::exp_shifted, as on the CPU), and every sum of fp32 data is
// double. The final scaling y = e * (1 / sum) takes the double 1 / sum as a pair of floats
// (TimesInv): no double operation per element, and y is the correctly rounded fp32 product but
// for one ulp about twice in 10^8 (and in ~1% of the results under 2^-107; the CPU's double
// product is correctly rounded): the output keeps 24 bits. (A float-pair exp argument with Kahan
// sums was faster but doubled the fp32 error ratios.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../kernels.h"
#include "rules.h"

namespace te_fast_kernels {
namespace softmax_detail {

using te_fast_rules::exp_shifted;
using te_fast_rules::kept_prefix;

constexpr int kWarp = 32;
constexpr int kSubWarpCtaThreads = 128;  // CTA size when several rows share a warp
constexpr int kBlockThreads = 512;       // the two-pass kernel's CTA size
constexpr int64_t kMaxCtas = 1 << 24;    // grid-stride loops cover any row count beyond this
// |shift| from which a fp16/bf16 exponent shift fl(m * c) is too coarse for fma(x, c, -shift)
// (shift_coarse says why; exp_of and the kernels' cold branches use the same line)
constexpr float kCoarseShift = 0x1p24f;
constexpr double kLog2e = 1.4426950408889634;

template <typename T>
constexpr bool kWide = std::is_same<T, float>::value;

// Per-thread sums: double for fp32 data, float for fp16/bf16.
template <typename T>
using Acc = std::conditional_t<kWide<T>, double, float>;

// Elements in one 16-byte access.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The unsigned type of one access of Bytes bytes.
template <int Bytes>
struct Raw {
  using type = std::conditional_t<
      Bytes == 1, uint8_t,
      std::conditional_t<Bytes == 2, uint16_t,
                         std::conditional_t<Bytes == 4, uint32_t,
                                            std::conditional_t<Bytes == 8, uint2, uint4>>>>;
};

// V consecutive elements as one register-held value: loaded and stored in one access.
template <typename T, int V>
struct Chunk {
  using R = typename Raw<V * sizeof(T)>::type;
  R raw;

  __device__ __forceinline__ void load(const T* p) { raw = *reinterpret_cast<const R*>(p); }
  __device__ __forceinline__ void clear() { raw = R{}; }
  __device__ __forceinline__ void unpack(float* out) const {
    alignas(16) T e[V];
    *reinterpret_cast<R*>(e) = raw;
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = to_float(e[k]);
  }
  __device__ __forceinline__ static void store_zero(T* p) { *reinterpret_cast<R*>(p) = R{}; }
  __device__ __forceinline__ static void store(T* p, const float* in) { pack(in).put(p); }
  __device__ __forceinline__ void put(T* p) const { *reinterpret_cast<R*>(p) = raw; }
  __device__ __forceinline__ static Chunk pack(const float* in) {
    alignas(16) T e[V];
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_float<T>(in[k]);
    Chunk out;
    out.raw = *reinterpret_cast<const R*>(e);
    return out;
  }

  // This chunk with its elements e >= n set to +0 (n <= 0: all of them; n >= V: none), on the
  // raw words: a few integer ANDs, with no element unpacked (a row's chunk that straddles its
  // causal limit, in the backward).
  __device__ __forceinline__ Chunk first(int n) const {
    Chunk out = *this;
    if constexpr (sizeof(R) >= 4) {
      constexpr int kWords = static_cast<int>(sizeof(R)) / 4;
      constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
      constexpr uint32_t kLane = sizeof(T) == 4 ? 0xffffffffu : (1u << (8 * sizeof(T))) - 1u;
      uint32_t* w = reinterpret_cast<uint32_t*>(&out.raw);
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        uint32_t m = 0;
#pragma unroll
        for (int l = 0; l < kPerWord; ++l) {
          m |= i * kPerWord + l < n ? kLane << (8 * sizeof(T) * l % 32) : 0u;
        }
        w[i] &= m;
      }
    } else {
      if (n <= 0) out.raw = R{};
    }
    return out;
  }
};

// Where a row sits: its query index i and its mask row (masked modes only, so the plain softmax
// does no division), by a multiply and a shift (Divisor, set by softmax_fwd_typed): in 32 bits
// below 2^31 rows, which is almost always, in 64 beyond.
struct RowPos {
  int64_t i;
  const bool* m;  // nullptr unless kExplicitMask
};

// masked (kMask kernels: the host launches them for kExplicitMask alone; the two-pass kernel
// passes the mode's test): i and the row of the explicit mask; otherwise i alone, for the causal
// modes.
__device__ __forceinline__ RowPos row_pos(const SoftmaxFwdArgs& a, int64_t row, bool masked) {
  if (!masked && a.mode == te_fast_rules::kNoMask) return {0, nullptr};
  int64_t i;
  int64_t batch = 0;
  if (a.rows <= kMaxDivisor32) {
    const uint32_t r = static_cast<uint32_t>(row);
    i = r - divide(r, a.by_sq) * static_cast<uint32_t>(a.sq);
    if (masked) batch = divide(r, a.by_head_rows);
  } else {
    const uint64_t r = static_cast<uint64_t>(row);
    i = static_cast<int64_t>(r - divide(r, a.by_sq) * static_cast<uint64_t>(a.sq));
    if (masked) batch = static_cast<int64_t>(divide(r, a.by_head_rows));
  }
  if (!masked) return {i, nullptr};
  return {i, a.mask + batch * a.mask_batch_stride + i * a.sk};
}

// Columns j < bwd_limit(a, row) of a backward row are read and computed: the row's kept prefix
// under a causal mode (kCausal, which the host sets for those alone), the whole row otherwise.
// Row `row` < a.rows.
template <bool kCausal>
__device__ __forceinline__ int64_t bwd_limit(const SoftmaxBwdArgs& a, int64_t row) {
  if constexpr (!kCausal) {
    return a.sk;
  } else {
    int64_t i;
    if (a.rows <= kMaxDivisor32) {
      const uint32_t r = static_cast<uint32_t>(row);
      i = r - divide(r, a.by_sq) * static_cast<uint32_t>(a.sq);
    } else {
      const uint64_t r = static_cast<uint64_t>(row);
      i = static_cast<int64_t>(r - divide(r, a.by_sq) * static_cast<uint64_t>(a.sq));
    }
    return kept_prefix(a.mode, i, a.sq, a.sk);
  }
}

// Columns j < row_limit may be kept: kept_prefix's causal cut, the whole row under an explicit
// mask.
template <bool kMask>
__device__ __forceinline__ int row_limit(const SoftmaxFwdArgs& a, const RowPos& p) {
  return kMask ? static_cast<int>(a.sk) : static_cast<int>(kept_prefix(a.mode, p.i, a.sq, a.sk));
}

// e = exp(scale * x - max) of one kept value: base 2 with the scale folded in for fp16/bf16
// (c = scale * log2 e; shift = the max of fl(x * c), a float), the accurate expf of a double
// argument for fp32 (the double scale; shift = the max of scale * x in double: exp_shifted).
// fp16/bf16 at c > 0 take the fma, as the hot loops do, but for a coarse shift (|shift| >= 2^24,
// shift_coarse), where the product is rounded first, fl(x * c) - shift, exactly 0 at the max
// that the shift was taken from: the two-pass kernel, the one caller at c > 0, folds its row in
// chunks, whose running max may be coarse (a chunk of scores near -FLT_MAX before the row's
// moderate ones: the fma gave that chunk an infinite sum and the row NaN).
// A row whose own max is coarse is computed again with a c of its own (softmax_fwd_block).
// At c <= 0 (scale <= 0: no hot loop) they work as the CPU does, in base e with the float
// scale and the product rounded first (exp_shifted; shift = the max of fl(x * scale)), which is
// exactly 0 at the max whatever the magnitude, and overflows only where |scale| > 1
// (c = scale * log2 e overflowed for bf16 scores near the range ends at scale -0.7).
template <typename T>
__device__ __forceinline__ float exp_of(float x, float c, double shift, double scale) {
  if constexpr (kWide<T>) {
    return exp_shifted<true>(x, scale, shift);
  } else if (c > 0.f) {
    const float s = static_cast<float>(shift);
    return exp2f(fabsf(s) < kCoarseShift ? fmaf(x, c, -s) : __fmul_rn(x, c) - s);
  } else {
    return exp_shifted<false>(x, scale, shift);
  }
}

// fp32 rows find their max score as the max of key * x, key = the sign of the op's double scale
// (exact), and take the exponent's shift as the max of scale * x in double from it (wide_shift),
// the argument's own form (te_fast_rules::exp_shifted says why).
__device__ __forceinline__ float wide_key(double scale) { return scale < 0.0 ? -1.f : 1.f; }
// The shift of an fp32 row whose max of key * x over kept columns is kx (-inf: none kept, 0).
__device__ __forceinline__ double wide_shift(float kx, double scale) {
  return kx == -INFINITY ? 0.0 : static_cast<double>(kx * wide_key(scale)) * scale;
}

// e where bit `bit` of `on` is set (a kept column), else +0, without a branch: the caller computes
// e for every column (a masked column's value, whatever it is, is dropped here). A branch around
// each exponential cost its reconvergence instructions per element (nvcc 13.0, sm_90).
__device__ __forceinline__ float keep_if(float e, uint32_t on, int bit) {
  return __uint_as_float(__float_as_uint(e) & (0u - (on >> bit & 1u)));
}

// 2^x with the hardware's approximation (MUFU.EX2, a relative error of about 2^-22): results
// under 2^-126 flush to 0, far below what an fp16/bf16 probability can hold next to the row's
// largest, which is 1.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Whether the shift fl(mx * c) of a fp16/bf16 row (scale > 0) is too coarse for the hot loop's
// e = 2^fma(x, c, -fl(mx * c)), for a finite kept max mx: |fl(mx * c)| >= 2^24 (overflow
// included). At the max, that argument is the product's own rounding error, mx * c - fl(mx * c),
// up to half an ulp of the shift: a common factor 2^delta of every e of the row, which the
// normalization removes while it is small, but delta reaches +-2^103 for bf16 scores near the
// range ends (an additive finfo(bf16).min mask): the max's e is then inf or 0 and the row NaN or 0,
// where its softmax is 1 / n on the n columns equal to mx and 0 elsewhere. (A test for an
// infinite shift alone is not enough: the range-end suite's scores give NaN rows at a scale of
// 0.7.) Under 2^24, |delta| <= 1/2. Over it, the kernels replace each kept x by
// x - mx (in the data's own type) and use the shift 0, so that the same loop computes
// e = 2^fma(x - mx, c, 0): 1 at mx; 0 at any other value: within a factor of 2 of mx the
// difference is exact (Sterbenz) and at least an ulp of mx, |mx| 2^-11 or more, so (x - mx) c
// is at most -2^13; further away |x - mx| >= |mx| / 2 (or -inf); NaN at a NaN, which poisons
// the row as before. A cold branch: the hot loop is unchanged (the test costs what the
// overflow's did). The two-pass kernel instead runs its first pass again with a c of the row's
// own (softmax_fwd_block).
__device__ __forceinline__ bool shift_coarse(float mx, float c) {
  return fabsf(mx * c) >= kCoarseShift && !isinf(mx);
}

// The final scaling of a row, e -> fl(e * inv), for an inv of type A. fp16/bf16 (A = float):
// one fp32 multiply, rounded again to T by the store.
template <typename A>
struct TimesInv {
  float inv;
  __device__ __forceinline__ explicit TimesInv(float i) : inv(i) {}
  __device__ __forceinline__ float operator()(float e) const { return e * inv; }
};
// fp32 data (A = double, inv = 1 / the double sum): the double inv is split once per row into two
// floats, hi = fl(inv) and lo = fl(inv - hi) (the difference is exact in double), and each element
// takes y = fma(e, hi, fl(e * lo)): no double arithmetic or conversion per element, where
// fl32(double(e) * inv) took a DMUL and an F2F back to fp32 (the widening of e is shared with the
// sum) on the fp64 and XU pipes, the XU being the busiest of the fp32 forward (ncu).
// This is e * inv rounded once to fp32 but for a term of ~2^-47 of it: e * hi is exact inside the
// fma; lo = fl(inv - hi) is off by at most 2^-24 of inv - hi, which is at most 2^-24 of inv, so
// hi + lo is within 2^-48 of inv; e * lo is ~2^-24 of the result and its own rounding costs 2^-24
// of that, 2^-48. The sum the fma rounds is thus within 2^-47 of e * inv, and the result differs
// from the correctly rounded one only where e * inv lies that close to the midpoint of two floats:
// then by one ulp. Checked on the CPU against the exact product: of 10^8 pairs, e =
// expf of [-20, 0] and inv = 1 / sums of 1 .. 1e5, two results were one ulp off (the double form
// was correctly rounded in all). Results under about 2^-107 are the exception: there e * lo falls
// below fp32's normal range and loses relative precision, and about 1% of them are one ulp off, an
// absolute error of 2^-131 or less, nothing next to the row's largest value.
template <>
struct TimesInv<double> {
  float hi;
  float lo;
  __device__ __forceinline__ explicit TimesInv(double inv)
      : hi(static_cast<float>(inv)), lo(static_cast<float>(inv - static_cast<double>(hi))) {}
  __device__ __forceinline__ float operator()(float e) const { return fmaf(e, hi, e * lo); }
};

}  // namespace softmax_detail
}  // namespace te_fast_kernels
