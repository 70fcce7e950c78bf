// Two-pass kernels, any row length: rows longer than the largest register or long-row
// configuration (128K columns, or clusters unavailable) take these (softmax_fwd_block,
// softmax_bwd_block), which have no length limit. One CTA per row; thread t takes the chunks from
// t * V, t * V + blockDim.x * V, ... The forward makes one online (max, sum) pass and one write
// pass, the backward one dot-product pass and one write pass; the second pass re-reads the row
// (from L2 when it is still there).
#pragma once

#include <cstdint>

#include "common.cuh"
#include "reduce.cuh"

namespace te_fast_kernels {
namespace softmax_detail {

struct MaxSum {
  double m;  // running max of fl(c * x) (fp16/bf16 at c > 0), fl(scale * x) (fp16/bf16 at
             // scale <= 0) or scale * x in double (fp32): exp_of's shift
  double s;  // sum of e = exp_of(x)
  float r;   // running max of the kept x themselves (fp16/bf16: shift_coarse's test)
};

__device__ __forceinline__ double max_nan(double a, double b) { return (a != a || a > b) ? a : b; }

// exp(from - to) in the kernel's base: 2 for fp16/bf16 at c > 0 (log2 e is folded into c), e
// otherwise.
__device__ __forceinline__ double rescale(double from, double to, bool two) {
  const double d = from - to;
  return two ? exp2(d) : exp(d);
}

// Folds the kept values of one chunk into the running (max, sum). A NaN becomes the max, which
// makes the sum NaN: the row is poisoned, as in a plain softmax.
template <typename T, int V>
__device__ __forceinline__ void online_add(MaxSum& t, const float* x, uint32_t bits, float c,
                                           double scale, bool two) {
  double cm = -INFINITY;
  float rm = -INFINITY;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    if (bits >> e & 1u) {
      cm = max_nan(cm, kWide<T> ? static_cast<double>(x[e]) * scale
                                : (two ? x[e] * c : x[e] * static_cast<float>(scale)));
      rm = fmaxf(rm, x[e]);
    }
  }
  t.r = fmaxf(t.r, rm);
  if (cm == -INFINITY) return;
  const double m = max_nan(t.m, cm);
  Acc<T> cs = 0;
#pragma unroll
  for (int e = 0; e < V; ++e) cs += bits >> e & 1u ? exp_of<T>(x[e], c, m, scale) : 0.f;
  // The rescale factor multiplies a whole partial sum: take it in double.
  t.s = (t.m == -INFINITY ? 0.0 : t.s * rescale(t.m, m, two)) + static_cast<double>(cs);
  t.m = m;
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b, bool two) {
  const float r = fmaxf(a.r, b.r);
  if (b.m == -INFINITY) return {a.m, a.s, r};
  if (a.m == -INFINITY) return {b.m, b.s, r};
  const double m = max_nan(a.m, b.m);
  return {m, a.s * rescale(a.m, m, two) + b.s * rescale(b.m, m, two), r};
}

__device__ inline MaxSum block_merge(MaxSum t, MaxSum* smem, bool two) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    t = merge(t,
              {__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o),
               __shfl_xor_sync(0xffffffffu, t.r, o)},
              two);
  }
  if (lane == 0) smem[warp] = t;
  __syncthreads();
  t = smem[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / kWarp); ++w) t = merge(t, smem[w], two);
  __syncthreads();  // smem is reused by the next row
  return t;
}

template <typename T, int V>
__device__ __forceinline__ uint32_t load_kept(const T* x, int64_t j0, const RowPos& r,
                                              int64_t limit, float* v) {
  uint32_t bits = 0;
  if (j0 < limit) {
    Chunk<T, V> ch;
    ch.load(x + j0);
    ch.unpack(v);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      bits |= j0 + e < limit && (r.m == nullptr || !r.m[j0 + e]) ? 1u << e : 0u;
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = 0.f;
  }
  return bits;
}

template <typename T, int V>
__global__ void __launch_bounds__(kBlockThreads) softmax_fwd_block(SoftmaxFwdArgs a) {
  __shared__ MaxSum smem[kBlockThreads / kWarp];
  const float kernel_c =
      kWide<T> ? static_cast<float>(a.scale) : static_cast<float>(a.scale * kLog2e);
  // base 2 for fp16/bf16 at c > 0; base e for fp32 and for fp16/bf16 at scale <= 0 (exp_of)
  const bool two = !kWide<T> && kernel_c > 0.f;
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const RowPos r = row_pos(a, row, a.mode == te_fast_rules::kExplicitMask);
    const int64_t limit = kept_prefix(a.mode, r.i, a.sq, a.sk);
    const T* x = static_cast<const T*>(a.x) + row * a.sk;
    auto first_pass = [&](float c) {
      MaxSum t{-INFINITY, 0.0, -INFINITY};
      for (int64_t j0 = threadIdx.x * V; j0 < limit; j0 += step) {
        float v[V];
        const uint32_t bits = load_kept<T, V>(x, j0, r, limit, v);
        online_add<T, V>(t, v, bits, c, a.scale, two);
      }
      return block_merge(t, smem, two);
    };
    float c = kernel_c;
    MaxSum t = first_pass(c);
    if (two && c > 0.f && shift_coarse(t.r, c)) {
      // (rare) The pass again with the row's own c = 2^(29 - ilogb r): r's biased exponent b is
      // at least 23 (|r| > 2^-104, as c < 2^128 and |r c| >= 2^24), and c's is 283 - b, or 254
      // where b < 29. r c is exact and in [2^23, 2^30), and (x - r) c is below -2^12 for any
      // other fp16/bf16 x (at least an ulp of r away), so the sum counts the columns equal to r
      // and the write gives them 1 / count, the others 0.
      const uint32_t b = __float_as_uint(t.r) >> 23 & 0xffu;
      c = __uint_as_float((b < 29u ? 254u : 283u - b) << 23);
      t = first_pass(c);
    }
    const double inv = t.s == 0.0 ? 0.0 : 1.0 / t.s;  // fully masked row -> 0
    const TimesInv<Acc<T>> times_inv(static_cast<Acc<T>>(inv));
    T* y = static_cast<T*>(a.y) + row * a.sk;
    for (int64_t j0 = threadIdx.x * V; j0 < a.sk; j0 += step) {
      float v[V];
      const uint32_t bits = load_kept<T, V>(x, j0, r, limit, v);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        v[e] = bits >> e & 1u && t.s != 0.0  // no kept finite score: all 0 (not -inf - -inf)
                   ? times_inv(exp_of<T>(v[e], c, t.m, a.scale))
                   : 0.f;
      }
      Chunk<T, V>::store(y + j0, v);
    }
  }
}

// kCausal (the causal modes): both passes stop at the row's kept prefix (a straddling chunk's
// lanes past it zeroed before the dot), and the write pass stores +0 past it (BwdRow says more).
template <typename T, int V, bool kCausal>
__global__ void __launch_bounds__(kBlockThreads) softmax_bwd_block(SoftmaxBwdArgs a) {
  __shared__ Slots<Acc<T>, kBlockThreads / kWarp> slots;
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t limit = bwd_limit<kCausal>(a, row);
    const T* dy = static_cast<const T*>(a.dy) + row * a.sk;
    const T* y = static_cast<const T*>(a.y) + row * a.sk;
    auto load_pair = [&](int64_t j0, float* g, float* p) {  // dy and y at columns j0 .. (kept)
      Chunk<T, V> cg;
      Chunk<T, V> cp;
      cg.load(dy + j0);
      cp.load(y + j0);
      if (kCausal) {
        const int kept = static_cast<int>(limit - j0 < V ? limit - j0 : V);
        cg = cg.first(kept);
        cp = cp.first(kept);
      }
      cg.unpack(g);
      cp.unpack(p);
    };
    Acc<T> part = 0;
    for (int64_t j0 = threadIdx.x * V; j0 < limit; j0 += step) {
      float g[V];
      float p[V];
      load_pair(j0, g, p);
#pragma unroll
      for (int e = 0; e < V; ++e) part += te_fast_rules::bwd_product<kWide<T>>(g[e], p[e]);
    }
    const Acc<T> dot = row_reduce<kBlockThreads, 1>(part, SumOp{}, slots);
    __syncthreads();  // the slots are reused by the next row
    T* dx = static_cast<T*>(a.dx) + row * a.sk;
    for (int64_t j0 = threadIdx.x * V; j0 < a.sk; j0 += step) {
      if (kCausal && j0 >= limit) {  // wholly past the kept prefix: a fill
        Chunk<T, V>::store_zero(dx + j0);
        continue;
      }
      float g[V];
      float p[V];
      load_pair(j0, g, p);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        g[e] = te_fast_rules::bwd_element<kWide<T>>(g[e], p[e], dot, a.scale);
      }
      if (kCausal) {  // +0 past the kept prefix
        Chunk<T, V>::pack(g).first(static_cast<int>(limit - j0 < V ? limit - j0 : V)).put(dx + j0);
      } else {
        Chunk<T, V>::store(dx + j0, g);
      }
    }
  }
}

}  // namespace softmax_detail
}  // namespace te_fast_kernels
