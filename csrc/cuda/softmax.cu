// Softmax forward/backward kernels for fp32/fp16/bf16 with fp32 accumulation.
//
// Two paths, chosen by row length only (both handle every mask mode):
//  - rows of up to 1024 columns: one warp per row, the row held in registers
//    (N = 1..32 elements per lane, so six instantiations per dtype and direction);
//  - longer rows, any length: one block per row. The forward makes one online (max, sum) pass
//    and one write pass; the backward one dot-product pass and one write pass. No length cliff.
// A row whose every column is masked (or -inf) is written as zeros.
// Elements are computed in fp32; row sums are accumulated in double, as on the CPU: with fp32
// inputs an fp32 sum would dominate the error, and these kernels are memory-bound.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels.h"
#include "rules.h"

namespace te_fast_kernels {
namespace {

using te_fast_rules::kept_prefix;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxWarpCols = 32 * kWarp;
constexpr int kBlockThreads = 512;
constexpr int64_t kMaxBlocks = 1 << 30;  // grid-stride loops cover any row count

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ const bool* mask_row(const SoftmaxFwdArgs& a, int64_t row, int64_t i) {
  if (a.mode != te_fast_rules::kExplicitMask) return nullptr;
  return a.mask + (row / (a.heads * a.sq)) * a.mask_batch_stride + i * a.sk;
}

__device__ __forceinline__ bool kept(const bool* m, int64_t j, int64_t limit) {
  return j < limit && (m == nullptr || !m[j]);
}

// ---------------------------------------------------------------- warp per row (<= 1024 cols)

template <typename T, int N>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) softmax_fwd_warp(SoftmaxFwdArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       row < a.rows; row += stride) {  // uniform across the warp
    const int64_t i = row % a.sq;
    const int64_t limit = kept_prefix(a.mode, i, a.sq, a.sk);
    const bool* m = mask_row(a, row, i);
    const T* x = static_cast<const T*>(a.x) + row * a.sk;
    float v[N];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t j = lane + k * kWarp;
      v[k] = kept(m, j, limit) ? load(x + j) * a.scale : -INFINITY;
      mx = fmaxf(mx, v[k]);
    }
    mx = warp_max(mx);
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      v[k] = v[k] == -INFINITY ? 0.f : expf(v[k] - mx);
      sum += v[k];
    }
    sum = warp_sum(sum);
    const double inv = sum == 0.0 ? 0.0 : 1.0 / sum;  // fully masked row -> 0
    T* y = static_cast<T*>(a.y) + row * a.sk;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t j = lane + k * kWarp;
      if (j < a.sk) store(y + j, static_cast<float>(v[k] * inv));
    }
  }
}

template <typename T, int N>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) softmax_bwd_warp(SoftmaxBwdArgs a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       row < a.rows; row += stride) {
    const T* dy = static_cast<const T*>(a.dy) + row * a.sk;
    const T* y = static_cast<const T*>(a.y) + row * a.sk;
    float g[N];
    float p[N];
    double acc = 0.0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t j = lane + k * kWarp;
      g[k] = j < a.sk ? load(dy + j) : 0.f;
      p[k] = j < a.sk ? load(y + j) : 0.f;
      acc += g[k] * p[k];
    }
    const float dot = static_cast<float>(warp_sum(acc));
    T* dx = static_cast<T*>(a.dx) + row * a.sk;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t j = lane + k * kWarp;
      if (j < a.sk) store(dx + j, a.scale * p[k] * (g[k] - dot));
    }
  }
}

// ---------------------------------------------------------------- block per row (any length)

struct MaxSum {
  float m;   // running max
  double s;  // sum of exp(v - m)
};

// NaN inputs take the "new max" branch and poison both fields, as they would a plain softmax.
__device__ __forceinline__ void online_add(MaxSum& t, float v) {
  if (v == -INFINITY) return;
  if (!(v <= t.m)) {
    t.s = t.s * expf(t.m - v) + 1.0;
    t.m = v;
  } else {
    t.s += expf(v - t.m);
  }
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  const float m = fmaxf(a.m, b.m);
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

__device__ __forceinline__ MaxSum warp_merge(MaxSum t) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    t = merge(t, {__shfl_xor_sync(0xffffffffu, t.m, o), __shfl_xor_sync(0xffffffffu, t.s, o)});
  }
  return t;
}

// Reduces over the block and returns the result to every thread; `smem` is reusable on return.
__device__ MaxSum block_merge(MaxSum t, MaxSum* smem) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  t = warp_merge(t);
  if (lane == 0) smem[warp] = t;
  __syncthreads();
  if (warp == 0) {
    t = lane < static_cast<int>(blockDim.x / kWarp) ? smem[lane] : MaxSum{-INFINITY, 0.0};
    t = warp_merge(t);
    if (lane == 0) smem[kWarp] = t;
  }
  __syncthreads();
  t = smem[kWarp];
  __syncthreads();
  return t;
}

__device__ double block_sum(double v, double* smem) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = warp_sum(v);
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / kWarp) ? smem[lane] : 0.0;
    v = warp_sum(v);
    if (lane == 0) smem[kWarp] = v;
  }
  __syncthreads();
  v = smem[kWarp];
  __syncthreads();
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) softmax_fwd_block(SoftmaxFwdArgs a) {
  __shared__ MaxSum smem[kWarp + 1];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t i = row % a.sq;
    const int64_t limit = kept_prefix(a.mode, i, a.sq, a.sk);
    const bool* m = mask_row(a, row, i);
    const T* x = static_cast<const T*>(a.x) + row * a.sk;
    MaxSum t{-INFINITY, 0.0};
    for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) {
      if (m == nullptr || !m[j]) online_add(t, load(x + j) * a.scale);
    }
    t = block_merge(t, smem);
    const double inv = t.s == 0.0 ? 0.0 : 1.0 / t.s;  // fully masked row -> 0
    T* y = static_cast<T*>(a.y) + row * a.sk;
    for (int64_t j = threadIdx.x; j < a.sk; j += blockDim.x) {
      float out = 0.f;
      if (kept(m, j, limit)) {
        const float v = load(x + j) * a.scale;
        out = v == -INFINITY ? 0.f : static_cast<float>(expf(v - t.m) * inv);
      }
      store(y + j, out);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlockThreads) softmax_bwd_block(SoftmaxBwdArgs a) {
  __shared__ double smem[kWarp + 1];
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* dy = static_cast<const T*>(a.dy) + row * a.sk;
    const T* y = static_cast<const T*>(a.y) + row * a.sk;
    double acc = 0.0;
    for (int64_t j = threadIdx.x; j < a.sk; j += blockDim.x) acc += load(dy + j) * load(y + j);
    const float dot = static_cast<float>(block_sum(acc, smem));
    T* dx = static_cast<T*>(a.dx) + row * a.sk;
    for (int64_t j = threadIdx.x; j < a.sk; j += blockDim.x) {
      store(dx + j, a.scale * load(y + j) * (load(dy + j) - dot));
    }
  }
}

// ---------------------------------------------------------------- launch

int64_t blocks_for(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

// Each warp-path instantiation covers 32 * N columns; pick the smallest that fits.
template <template <typename, int> class Launch, typename T, typename Args>
cudaError_t dispatch_cols(const Args& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(blocks_for(a.rows, kWarpsPerBlock)));
  const dim3 block(kWarpsPerBlock * kWarp);
  const int64_t n = (a.sk + kWarp - 1) / kWarp;
  if (n <= 1) return Launch<T, 1>::run(grid, block, a, stream);
  if (n <= 2) return Launch<T, 2>::run(grid, block, a, stream);
  if (n <= 4) return Launch<T, 4>::run(grid, block, a, stream);
  if (n <= 8) return Launch<T, 8>::run(grid, block, a, stream);
  if (n <= 16) return Launch<T, 16>::run(grid, block, a, stream);
  return Launch<T, 32>::run(grid, block, a, stream);
}

template <typename T, int N>
struct FwdWarp {
  static cudaError_t run(dim3 grid, dim3 block, const SoftmaxFwdArgs& a, cudaStream_t s) {
    softmax_fwd_warp<T, N><<<grid, block, 0, s>>>(a);
    return cudaGetLastError();
  }
};

template <typename T, int N>
struct BwdWarp {
  static cudaError_t run(dim3 grid, dim3 block, const SoftmaxBwdArgs& a, cudaStream_t s) {
    softmax_bwd_warp<T, N><<<grid, block, 0, s>>>(a);
    return cudaGetLastError();
  }
};

template <typename T>
cudaError_t fwd_typed(const SoftmaxFwdArgs& a, cudaStream_t stream) {
  if (a.sk <= kMaxWarpCols) return dispatch_cols<FwdWarp, T>(a, stream);
  softmax_fwd_block<T><<<static_cast<unsigned>(blocks_for(a.rows, 1)), kBlockThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t bwd_typed(const SoftmaxBwdArgs& a, cudaStream_t stream) {
  if (a.sk <= kMaxWarpCols) return dispatch_cols<BwdWarp, T>(a, stream);
  softmax_bwd_block<T><<<static_cast<unsigned>(blocks_for(a.rows, 1)), kBlockThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_softmax_fwd(DType dtype, const SoftmaxFwdArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.sk == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32: return fwd_typed<float>(args, stream);
    case DType::kFloat16: return fwd_typed<__half>(args, stream);
    case DType::kBFloat16: return fwd_typed<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_softmax_bwd(DType dtype, const SoftmaxBwdArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.sk == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32: return bwd_typed<float>(args, stream);
    case DType::kFloat16: return bwd_typed<__half>(args, stream);
    case DType::kBFloat16: return bwd_typed<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace te_fast_kernels
