// One chunk of a row as a kernel sees it: which of its columns are kept (an explicit mask's V
// bytes, MaskChunk; the causal cut and the mask as bits, kept_bits) and, for fp16/bf16, its
// values two to a 32-bit word (Packed) with the masked columns turned to -inf (packed_words).
// Used by the register rows (rows.cuh) and the long rows (long_rows.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common.cuh"

namespace te_fast_kernels {
namespace softmax_detail {

// V mask bytes as loaded, or nothing when the kernel has no explicit mask.
template <int V, bool kMask>
struct MaskChunk {
  static constexpr bool kOn = true;
  typename Raw<V>::type raw;
  __device__ __forceinline__ void load(const bool* m) {
    raw = *reinterpret_cast<const typename Raw<V>::type*>(m);
  }
  // Bit e set when column e of the chunk is masked out.
  __device__ __forceinline__ uint32_t bits() const {
    if constexpr (V == 4) {
      return gather4(raw);
    } else if constexpr (V == 8) {
      return gather4(raw.x) | gather4(raw.y) << 4;
    }
    alignas(8) uint8_t b[V];
    *reinterpret_cast<typename Raw<V>::type*>(b) = raw;
    uint32_t out = 0;
#pragma unroll
    for (int e = 0; e < V; ++e) out |= b[e] ? 1u << e : 0u;
    return out;
  }
  // Bit e of the result set when byte e of w is nonzero: each nonzero byte to 0x01 in place, then
  // one multiply moves byte e's bit to bit 24 + e (the partial products land on distinct bits
  // below 24 or past 31, so nothing carries into bits 24..27).
  __device__ __forceinline__ static uint32_t gather4(uint32_t w) {
    return ((__vcmpne4(w, 0u) & 0x01010101u) * 0x01020408u) >> 24;
  }
  // For packed 16-bit values: 0xffff in each 16-bit lane of word i (columns 2i and 2i + 1) whose
  // column is masked out.
  __device__ __forceinline__ uint32_t lanes(int i) const {
    static_assert(V == 8, "packed words come from 16-byte chunks of 16-bit values");
    const uint32_t four = __vcmpne4(i < 2 ? raw.x : raw.y, 0u);  // 0xff in each masked byte
    return __byte_perm(four, 0u, i % 2 == 0 ? 0x1100 : 0x3322);
  }
};
template <int V>
struct MaskChunk<V, false> {
  static constexpr bool kOn = false;
  __device__ __forceinline__ void load(const bool*) {}
  __device__ __forceinline__ uint32_t bits() const { return 0; }
};

// fp16/bf16 values two to a 32-bit word, as loaded: the dtype's -inf in both lanes, the max of
// each lane pair (HMNMX2: exact, and it drops a NaN as fmaxf does), and each lane widened.
template <typename T>
struct Packed;
template <>
struct Packed<__nv_bfloat16> {
  static constexpr uint32_t kNegInf2 = 0xff80ff80u;
  __device__ __forceinline__ static uint32_t max2(uint32_t a, uint32_t b) {
    const __nv_bfloat162 m = __hmax2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                     *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&m);
  }
  __device__ __forceinline__ static float lo(uint32_t w) { return __uint_as_float(w << 16); }
  __device__ __forceinline__ static float hi(uint32_t w) {
    return __uint_as_float(w & 0xffff0000u);
  }
  // v (a bf16 value) in both lanes
  __device__ __forceinline__ static uint32_t splat(float v) {
    return (__float_as_uint(v) >> 16) * 0x00010001u;
  }
  // a - b in each lane, rounded to bf16
  __device__ __forceinline__ static uint32_t sub2(uint32_t a, uint32_t b) {
    const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                     *reinterpret_cast<const __nv_bfloat162*>(&b));
    return *reinterpret_cast<const uint32_t*>(&d);
  }
};
template <>
struct Packed<__half> {
  static constexpr uint32_t kNegInf2 = 0xfc00fc00u;
  __device__ __forceinline__ static uint32_t max2(uint32_t a, uint32_t b) {
    const __half2 m = __hmax2(*reinterpret_cast<const __half2*>(&a),
                              *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&m);
  }
  __device__ __forceinline__ static float lo(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  }
  __device__ __forceinline__ static float hi(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  // v (an fp16 value) in both lanes
  __device__ __forceinline__ static uint32_t splat(float v) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(v))) * 0x00010001u;
  }
  // a - b in each lane, rounded to fp16
  __device__ __forceinline__ static uint32_t sub2(uint32_t a, uint32_t b) {
    const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&a),
                              *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const uint32_t*>(&d);
  }
};

// One 16-byte chunk of fp16/bf16 columns j0 .. j0 + V - 1 as V / 2 packed words: columns at or
// past `limit` (the causal cut) and the mask's columns become the dtype's -inf (one LOP3 a word).
// raw() gives the chunk as loaded and is called only when some column is below the limit (a chunk
// wholly past it was never loaded); masked() gives its MaskChunk.
template <typename T, int V, typename RawAt, typename MaskedAt>
__device__ __forceinline__ void packed_words(int j0, int limit, RawAt raw_at, MaskedAt masked,
                                             uint32_t* w) {
  using P = Packed<T>;
  constexpr int kW = V / 2;
  if (j0 >= limit) {  // never loaded: wholly masked
#pragma unroll
    for (int i = 0; i < kW; ++i) w[i] = P::kNegInf2;
    return;
  }
  const auto raw = raw_at();
  static_assert(sizeof(raw) == kW * sizeof(uint32_t), "one 16-byte chunk");
#pragma unroll
  for (int i = 0; i < kW; ++i) w[i] = reinterpret_cast<const uint32_t*>(&raw)[i];
  if (j0 + V > limit) {  // the chunk the causal limit cuts
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const uint32_t cut = (j0 + 2 * i < limit ? 0u : 0x0000ffffu) |
                           (j0 + 2 * i + 1 < limit ? 0u : 0xffff0000u);
      w[i] = (w[i] & ~cut) | (P::kNegInf2 & cut);
    }
  }
  if constexpr (decltype(masked())::kOn) {
    const auto m = masked();
#pragma unroll
    for (int i = 0; i < kW; ++i) {
      const uint32_t off = m.lanes(i);
      w[i] = (w[i] & ~off) | (P::kNegInf2 & off);
    }
  }
}

// Bit e set where column j0 + e of a chunk of V columns is kept: below `limit` (the causal cut)
// and not in the chunk's MaskChunk m.
template <int V, typename M>
__device__ __forceinline__ uint32_t kept_bits(int j0, int limit, const M& m) {
  constexpr uint32_t kFull = V == 32 ? 0xffffffffu : (1u << V) - 1u;
  uint32_t bits = kFull;
  if (j0 + V > limit) {
#pragma unroll
    for (int e = 0; e < V; ++e) bits &= j0 + e < limit ? kFull : ~(1u << e);
  }
  return bits & ~m.bits();
}

}  // namespace softmax_detail
}  // namespace te_fast_kernels
