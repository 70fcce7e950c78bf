// THD <-> BSHD token-row copies. Rows are copied in the widest unit (16/8/4/2/1 bytes) that the
// row size and both pointers allow, so one kernel per direction serves every dtype, fp8 included.
// Bad cu_seqlens never cause an out-of-bounds access: every read is guarded by the shared
// te_fast_rules::sequence_ok rule, and the affected sequences (all of the output when cu_seqlens
// is not monotone) are written as NaN, a visible signal that costs no host sync.
#include <cstring>

#include "kernels.h"
#include "rules.h"

namespace te_fast_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 20;

// Whole-array rule, checked by every block before it copies: overlapping sequences from a
// non-monotone cu_seqlens would otherwise be copied without any sequence looking bad by itself.
__device__ bool block_cu_seqlens_monotone(const int32_t* cu, int64_t batch) {
  int bad = 0;
  for (int64_t x = threadIdx.x; x < batch; x += blockDim.x) bad |= cu[x + 1] < cu[x];
  return !__syncthreads_or(bad);
}

template <typename U>
__global__ void __launch_bounds__(kThreads) thd_to_bshd_kernel(ConvertArgs a, int64_t units,
                                                               U nan_unit) {
  const U* src = static_cast<const U*>(a.src);
  U* dst = static_cast<U*>(a.dst);
  const int32_t* cu = a.cu_seqlens;
  const bool monotone = block_cu_seqlens_monotone(cu, a.batch);
  const int64_t total = a.batch * a.seqlen * units;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / units;
    const int64_t u = idx - row * units;
    const int64_t x = row / a.seqlen;
    const int64_t s = row - x * a.seqlen;
    U value{};
    if (!monotone || !te_fast_rules::sequence_ok(cu, x, a.tokens, a.seqlen)) {
      value = nan_unit;
    } else if (s < cu[x + 1] - cu[x]) {
      value = src[(cu[x] + s) * units + u];
    }
    dst[idx] = value;
  }
}

template <typename U>
__global__ void __launch_bounds__(kThreads) bshd_to_thd_kernel(ConvertArgs a, int64_t units,
                                                               U nan_unit) {
  const U* src = static_cast<const U*>(a.src);
  U* dst = static_cast<U*>(a.dst);
  const int32_t* cu = a.cu_seqlens;
  const int64_t used = cu[a.batch];
  const bool tokens_ok =
      block_cu_seqlens_monotone(cu, a.batch) && cu[0] == 0 && used >= 0 && used <= a.tokens;
  const int64_t total = a.tokens * units;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / units;
    const int64_t u = idx - r * units;
    U value{};  // rows past cu_seqlens[-1] stay zero
    if (!tokens_ok) {
      value = nan_unit;
    } else if (r < used) {
      // The sequence holding token r: the last x with cu[x] <= r (skips empty sequences).
      int64_t lo = 0;
      int64_t hi = a.batch - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= r) lo = mid; else hi = mid - 1;
      }
      if (te_fast_rules::sequence_ok(cu, lo, a.tokens, a.seqlen) && r < cu[lo + 1]) {
        value = src[(lo * a.seqlen + (r - cu[lo])) * units + u];
      } else {
        value = nan_unit;
      }
    }
    dst[idx] = value;
  }
}

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
  const int64_t total = (kToBshd ? a.batch * a.seqlen : a.tokens) * units;
  if (total == 0) return cudaSuccess;
  int64_t blocks = (total + kThreads - 1) / kThreads;
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
