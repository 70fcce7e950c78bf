// THD <-> BSHD token-row copies, one warp per token row. Rows are copied in the widest unit
// (16/8/4/2/1 bytes) that the row size and both pointers allow, so one kernel per direction
// serves every dtype, fp8 included.
// Bad cu_seqlens never cause an out-of-bounds access: every read is guarded by the shared
// te_fast_rules::sequence_ok rule, and the affected sequences (all of the output when cu_seqlens
// is not monotone) are written as NaN, a visible signal that costs no host sync.
#include <cstring>

#include "kernels.h"
#include "rules.h"

namespace te_fast_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr int64_t kMaxBlocks = 1 << 20;

// Whole-array rule, checked by every block before it copies: overlapping sequences from a
// non-monotone cu_seqlens would otherwise be copied without any sequence looking bad by itself.
__device__ bool block_cu_seqlens_monotone(const int32_t* cu, int64_t batch) {
  int bad = 0;
  for (int64_t x = threadIdx.x; x < batch; x += blockDim.x) bad |= cu[x + 1] < cu[x];
  return !__syncthreads_or(bad);
}

// One warp moves one token row: four independent 16-byte (or narrower) loads in flight per lane
// before the first store.
template <typename U>
__device__ __forceinline__ void copy_row(const U* __restrict__ src, U* __restrict__ dst,
                                         int64_t units, int lane) {
  int64_t u = lane;
  for (; u + 3 * kWarp < units; u += 4 * kWarp) {
    const U a0 = src[u];
    const U a1 = src[u + kWarp];
    const U a2 = src[u + 2 * kWarp];
    const U a3 = src[u + 3 * kWarp];
    dst[u] = a0;
    dst[u + kWarp] = a1;
    dst[u + 2 * kWarp] = a2;
    dst[u + 3 * kWarp] = a3;
  }
  for (; u < units; u += kWarp) dst[u] = src[u];
}

template <typename U>
__device__ __forceinline__ void fill_row(U* dst, int64_t units, int lane, U value) {
  for (int64_t u = lane; u < units; u += kWarp) dst[u] = value;
}

// Warp w of the grid takes rows w, w + warps, ...: per-row index arithmetic, not per unit.
#define TE_FAST_FOR_EACH_WARP_ROW(row, rows)                                                     \
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; \
       row < (rows); row += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock)

// The typed views of one launch's arguments that both directions use.
template <typename U>
struct Copy {
  const U* src;
  U* dst;
  const int32_t* cu;
  int lane;
  __device__ explicit Copy(const ConvertArgs& a)
      : src(static_cast<const U*>(a.src)),
        dst(static_cast<U*>(a.dst)),
        cu(a.cu_seqlens),
        lane(static_cast<int>(threadIdx.x % kWarp)) {}
};

template <typename U>
__global__ void __launch_bounds__(kThreads) thd_to_bshd_kernel(ConvertArgs a, int64_t units,
                                                               U nan_unit) {
  const Copy<U> c(a);
  const int32_t* cu = c.cu;
  const bool monotone = block_cu_seqlens_monotone(cu, a.batch);
  TE_FAST_FOR_EACH_WARP_ROW(row, a.batch * a.seqlen) {
    const int64_t x = row / a.seqlen;
    const int64_t s = row - x * a.seqlen;
    U* out = c.dst + row * units;
    if (!monotone || !te_fast_rules::sequence_ok(cu, x, a.tokens, a.seqlen)) {
      fill_row(out, units, c.lane, nan_unit);
    } else if (s < cu[x + 1] - cu[x]) {
      copy_row(c.src + (cu[x] + s) * units, out, units, c.lane);
    } else {
      fill_row(out, units, c.lane, U{});  // padding
    }
  }
}

template <typename U>
__global__ void __launch_bounds__(kThreads) bshd_to_thd_kernel(ConvertArgs a, int64_t units,
                                                               U nan_unit) {
  const Copy<U> c(a);
  const int32_t* cu = c.cu;
  const int64_t used = cu[a.batch];
  const bool tokens_ok =
      block_cu_seqlens_monotone(cu, a.batch) && cu[0] == 0 && used >= 0 && used <= a.tokens;
  TE_FAST_FOR_EACH_WARP_ROW(r, a.tokens) {
    U* out = c.dst + r * units;
    if (!tokens_ok) {
      fill_row(out, units, c.lane, nan_unit);
      continue;
    }
    if (r >= used) {
      fill_row(out, units, c.lane, U{});  // rows past cu_seqlens[-1] stay zero
      continue;
    }
    // The sequence holding token r: the last x with cu[x] <= r (skips empty sequences).
    int64_t lo = 0;
    int64_t hi = a.batch - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (cu[mid] <= r) lo = mid; else hi = mid - 1;
    }
    if (te_fast_rules::sequence_ok(cu, lo, a.tokens, a.seqlen) && r < cu[lo + 1]) {
      copy_row(c.src + (lo * a.seqlen + (r - cu[lo])) * units, out, units, c.lane);
    } else {
      fill_row(out, units, c.lane, nan_unit);
    }
  }
}

#undef TE_FAST_FOR_EACH_WARP_ROW

template <typename U>
U replicate_nan(const ConvertArgs& a) {
  unsigned char bytes[sizeof(U)];
  for (size_t k = 0; k < sizeof(U); k += a.elem_size) std::memcpy(bytes + k, &a.nan_bits, a.elem_size);
  U unit;
  std::memcpy(&unit, bytes, sizeof(U));
  return unit;
}

template <bool kToBshd, typename U>
cudaError_t launch_unit(const ConvertArgs& a, cudaStream_t stream) {
  const int64_t units = a.row_bytes / static_cast<int64_t>(sizeof(U));
  const int64_t rows = kToBshd ? a.batch * a.seqlen : a.tokens;
  if (rows == 0) return cudaSuccess;
  int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  blocks = blocks < kMaxBlocks ? blocks : kMaxBlocks;
  const U nan_unit = replicate_nan<U>(a);
  if (kToBshd) {
    thd_to_bshd_kernel<U><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, units, nan_unit);
  } else {
    bshd_to_thd_kernel<U><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a, units, nan_unit);
  }
  return cudaGetLastError();
}

// The widest unit dividing the row size and both base addresses; never narrower than an element.
template <bool kToBshd>
cudaError_t launch(const ConvertArgs& a, cudaStream_t stream) {
  if (a.row_bytes == 0) return cudaSuccess;  // h * d == 0: nothing to copy or poison
  const uintptr_t align = reinterpret_cast<uintptr_t>(a.src) | reinterpret_cast<uintptr_t>(a.dst) |
                          static_cast<uintptr_t>(a.row_bytes);
  if (align % 16 == 0) return launch_unit<kToBshd, uint4>(a, stream);
  if (align % 8 == 0) return launch_unit<kToBshd, uint2>(a, stream);
  if (align % 4 == 0) return launch_unit<kToBshd, uint32_t>(a, stream);
  if (align % 2 == 0) return launch_unit<kToBshd, uint16_t>(a, stream);
  return launch_unit<kToBshd, uint8_t>(a, stream);
}

}  // namespace

cudaError_t launch_thd_to_bshd(const ConvertArgs& args, cudaStream_t stream) {
  return launch<true>(args, stream);
}

cudaError_t launch_bshd_to_thd(const ConvertArgs& args, cudaStream_t stream) {
  return launch<false>(args, stream);
}

}  // namespace te_fast_kernels
