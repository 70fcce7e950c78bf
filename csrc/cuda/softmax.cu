// Softmax forward/backward kernels for fp32/fp16/bf16 with fp32 (or wider) accumulation.
//
// Two paths, chosen by row length only (both handle every mask mode):
//  - rows of up to 1024 columns: one warp per row, the row held in registers
//    (N = 1..32 elements per lane, six widths per dtype and direction);
//  - longer rows, any length: one block per row. The forward makes one online (max, sum) pass
//    and one write pass; the backward one dot-product pass and one write pass. No length cliff.
// Both paths move V consecutive elements per lane and access (up to 16 bytes) when sk and the
// pointers allow it, else one element (V = 1), so odd row lengths and offset views still work.
// A row whose every column is masked (or -inf) is written as zeros; a NaN poisons its row.
//
// Precision: elements are computed in fp32 with the accurate expf; for fp32 data the exp argument
// scale * x - max is formed in double (te_fast_rules::exp_shifted), as on the CPU. Each lane's
// partial sums are kept in Acc<T> (double for fp32 data, whose output keeps 24 bits; float for
// fp16/bf16, whose output rounding is 2^13 times coarser than fp32 arithmetic); the sums across
// lanes and warps are always double, and fp32 outputs are scaled in double.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels.h"
#include "rules.h"

namespace te_fast_kernels {
namespace {

using te_fast_rules::exp_shifted;
using te_fast_rules::kept_prefix;

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kMaxWarpCols = 32 * kWarp;
constexpr int kBlockThreads = 512;
constexpr int64_t kMaxBlocks = 1 << 30;  // grid-stride loops cover any row count

template <typename T>
using Acc = std::conditional_t<std::is_same<T, float>::value, double, float>;

// Elements in one 16-byte access.
template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <int Bytes>
struct Raw;
template <>
struct Raw<4> {
  using type = uint32_t;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<16> {
  using type = uint4;
};

// V consecutive elements at p (aligned to V * sizeof(T) when V > 1), widened to float.
template <typename T, int V>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
  if constexpr (V == 1) {
    out[0] = load(p);
  } else {
    using R = typename Raw<V * sizeof(T)>::type;
    alignas(16) T e[V];
    *reinterpret_cast<R*>(e) = *reinterpret_cast<const R*>(p);
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = load(e + k);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const float* in) {
  if constexpr (V == 1) {
    store(p, in[0]);
  } else {
    using R = typename Raw<V * sizeof(T)>::type;
    alignas(16) T e[V];
#pragma unroll
    for (int k = 0; k < V; ++k) store(e + k, in[k]);
    *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(e);
  }
}

// Like fmaxf, but a NaN wins (so that it reaches the sum and poisons the row).
__device__ __forceinline__ float max_nan(float a, float b) { return (a != a || a > b) ? a : b; }

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

// Where a row sits: its query index i and its mask row. Only the masked modes need them, so the
// plain softmax does no 64-bit division per row.
struct RowPos {
  int64_t i;
  const bool* m;  // nullptr unless kExplicitMask
};

__device__ __forceinline__ RowPos row_pos(const SoftmaxFwdArgs& a, int64_t row) {
  if (a.mode == te_fast_rules::kNoMask) return {0, nullptr};
  const int64_t i = row % a.sq;
  if (a.mode != te_fast_rules::kExplicitMask) return {i, nullptr};
  return {i, a.mask + (row / (a.heads * a.sq)) * a.mask_batch_stride + i * a.sk};
}

__device__ __forceinline__ bool kept(const bool* m, int64_t j, int64_t limit) {
  return j < limit && (m == nullptr || !m[j]);
}

// fp32 data form exp arguments in double (see te_fast_rules::exp_shifted).
template <typename T>
constexpr bool kWide = std::is_same<T, float>::value;

// Loads the V raw elements at j0 when any may be kept (else zeros); bit e of the result says
// whether column j0 + e is kept.
template <typename T, int V>
__device__ __forceinline__ uint32_t load_kept(const T* x, int64_t j0, const RowPos& r,
                                              int64_t limit, float* v) {
  uint32_t bits = 0;
  if (j0 < limit) {
    load_vec<T, V>(x + j0, v);
#pragma unroll
    for (int e = 0; e < V; ++e) bits |= kept(r.m, j0 + e, limit) ? 1u << e : 0u;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) v[e] = 0.f;
  }
  return bits;
}

// exp(scale * x - m) of a kept column, or 0 for a masked one or a score of -inf.
template <typename T>
__device__ __forceinline__ float kept_exp(bool on, float x, float scale, float m) {
  return on && x * scale != -INFINITY ? exp_shifted<kWide<T>>(x, scale, m) : 0.f;
}

// ---------------------------------------------------------------- warp per row (<= 1024 cols)
// Lane l holds chunks c = 0 .. N/V - 1, each the V columns from (c * 32 + l) * V.

template <typename T, int N, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) softmax_fwd_warp(SoftmaxFwdArgs a) {
  constexpr int kChunks = N / V;
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       row < a.rows; row += stride) {  // uniform across the warp
    const RowPos r = row_pos(a, row);
    const int64_t limit = kept_prefix(a.mode, r.i, a.sq, a.sk);
    const T* x = static_cast<const T*>(a.x) + row * a.sk;
    float v[N];       // raw x, then exp(scale * x - max)
    uint32_t on = 0;  // bit k: v[k]'s column is kept
    float mx = -INFINITY;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t bits = load_kept<T, V>(x, (static_cast<int64_t>(c) * kWarp + lane) * V, r,
                                            limit, v + c * V);
      on |= bits << (c * V);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if (bits >> e & 1u) mx = fmaxf(mx, v[c * V + e] * a.scale);
      }
    }
    mx = warp_max(mx);
    Acc<T> part = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      v[k] = kept_exp<T>(on >> k & 1u, v[k], a.scale, mx);
      part += v[k];
    }
    const double sum = warp_sum(static_cast<double>(part));
    const Acc<T> inv = sum == 0.0 ? Acc<T>(0) : static_cast<Acc<T>>(1.0 / sum);  // masked row: 0
    T* y = static_cast<T*>(a.y) + row * a.sk;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t j0 = (static_cast<int64_t>(c) * kWarp + lane) * V;
      if (j0 >= a.sk) continue;
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = static_cast<float>(v[c * V + e] * inv);
      store_vec<T, V>(y + j0, o);
    }
  }
}

template <typename T, int N, int V>
__global__ void __launch_bounds__(kWarpsPerBlock * kWarp) softmax_bwd_warp(SoftmaxBwdArgs a) {
  constexpr int kChunks = N / V;
  const int lane = threadIdx.x % kWarp;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       row < a.rows; row += stride) {
    const T* dy = static_cast<const T*>(a.dy) + row * a.sk;
    const T* y = static_cast<const T*>(a.y) + row * a.sk;
    float g[N];
    float p[N];
    Acc<T> part = 0;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t j0 = (static_cast<int64_t>(c) * kWarp + lane) * V;
      if (j0 < a.sk) {
        load_vec<T, V>(dy + j0, g + c * V);
        load_vec<T, V>(y + j0, p + c * V);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) g[c * V + e] = p[c * V + e] = 0.f;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) part += g[c * V + e] * p[c * V + e];
    }
    const float dot = static_cast<float>(warp_sum(static_cast<double>(part)));
    T* dx = static_cast<T*>(a.dx) + row * a.sk;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t j0 = (static_cast<int64_t>(c) * kWarp + lane) * V;
      if (j0 >= a.sk) continue;
      float o[V];
#pragma unroll
      for (int e = 0; e < V; ++e) o[e] = a.scale * p[c * V + e] * (g[c * V + e] - dot);
      store_vec<T, V>(dx + j0, o);
    }
  }
}

// ---------------------------------------------------------------- block per row (any length)
// Thread t takes the chunks of V columns from t * V, t * V + blockDim.x * V, ...

struct MaxSum {
  float m;   // running max
  double s;  // sum of exp(v - m)
};

// Folds V raw values (bit e of `bits`: kept) into the running (max of fl(scale * x), sum). A NaN
// becomes the max, which makes the sum NaN: the row is poisoned, as in a plain softmax.
template <typename T, int V>
__device__ __forceinline__ void online_add(MaxSum& t, const float* x, uint32_t bits, float scale) {
  float cm = -INFINITY;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    if (bits >> e & 1u) cm = max_nan(cm, x[e] * scale);
  }
  if (cm == -INFINITY) return;
  const float m = max_nan(t.m, cm);
  Acc<T> cs = 0;
#pragma unroll
  for (int e = 0; e < V; ++e) cs += kept_exp<T>(bits >> e & 1u, x[e], scale, m);
  t.s = (t.m == -INFINITY ? 0.0 : t.s * expf(t.m - m)) + static_cast<double>(cs);
  t.m = m;
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


template <typename T, int V>
__global__ void __launch_bounds__(kBlockThreads) softmax_fwd_block(SoftmaxFwdArgs a) {
  __shared__ MaxSum smem[kWarp + 1];
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const RowPos r = row_pos(a, row);
    const int64_t limit = kept_prefix(a.mode, r.i, a.sq, a.sk);
    const T* x = static_cast<const T*>(a.x) + row * a.sk;
    MaxSum t{-INFINITY, 0.0};
    for (int64_t j0 = threadIdx.x * V; j0 < limit; j0 += step) {
      float v[V];
      const uint32_t bits = load_kept<T, V>(x, j0, r, limit, v);
      online_add<T, V>(t, v, bits, a.scale);
    }
    t = block_merge(t, smem);
    const double inv = t.s == 0.0 ? 0.0 : 1.0 / t.s;  // fully masked row -> 0
    const Acc<T> inv_acc = static_cast<Acc<T>>(inv);
    T* y = static_cast<T*>(a.y) + row * a.sk;
    for (int64_t j0 = threadIdx.x * V; j0 < a.sk; j0 += step) {
      float v[V];
      const uint32_t bits = load_kept<T, V>(x, j0, r, limit, v);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        v[e] = static_cast<float>(kept_exp<T>(bits >> e & 1u, v[e], a.scale, t.m) * inv_acc);
      }
      store_vec<T, V>(y + j0, v);
    }
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(kBlockThreads) softmax_bwd_block(SoftmaxBwdArgs a) {
  __shared__ double smem[kWarp + 1];
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* dy = static_cast<const T*>(a.dy) + row * a.sk;
    const T* y = static_cast<const T*>(a.y) + row * a.sk;
    Acc<T> part = 0;
    for (int64_t j0 = threadIdx.x * V; j0 < a.sk; j0 += step) {
      float g[V];
      float p[V];
      load_vec<T, V>(dy + j0, g);
      load_vec<T, V>(y + j0, p);
#pragma unroll
      for (int e = 0; e < V; ++e) part += g[e] * p[e];
    }
    const float dot = static_cast<float>(block_sum(static_cast<double>(part), smem));
    T* dx = static_cast<T*>(a.dx) + row * a.sk;
    for (int64_t j0 = threadIdx.x * V; j0 < a.sk; j0 += step) {
      float g[V];
      float p[V];
      load_vec<T, V>(dy + j0, g);
      load_vec<T, V>(y + j0, p);
#pragma unroll
      for (int e = 0; e < V; ++e) g[e] = a.scale * p[e] * (g[e] - dot);
      store_vec<T, V>(dx + j0, g);
    }
  }
}

// ---------------------------------------------------------------- launch

int64_t blocks_for(int64_t work, int64_t per_block) {
  const int64_t b = (work + per_block - 1) / per_block;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Whether every row can be read and written V elements at a time: whole chunks per row, and
// each tensor's start aligned to a chunk (rows then are too).
template <typename T>
bool chunks_fit(const SoftmaxFwdArgs& a, int v) {
  const int bytes = v * static_cast<int>(sizeof(T));
  return a.sk % v == 0 && aligned(a.x, bytes) && aligned(a.y, bytes);
}

template <typename T>
bool chunks_fit(const SoftmaxBwdArgs& a, int v) {
  const int bytes = v * static_cast<int>(sizeof(T));
  return a.sk % v == 0 && aligned(a.dy, bytes) && aligned(a.y, bytes) && aligned(a.dx, bytes);
}

template <typename T, int N, int V>
struct FwdWarp {
  static void run(dim3 grid, dim3 block, const SoftmaxFwdArgs& a, cudaStream_t s) {
    softmax_fwd_warp<T, N, V><<<grid, block, 0, s>>>(a);
  }
};

template <typename T, int N, int V>
struct BwdWarp {
  static void run(dim3 grid, dim3 block, const SoftmaxBwdArgs& a, cudaStream_t s) {
    softmax_bwd_warp<T, N, V><<<grid, block, 0, s>>>(a);
  }
};

// The widest access that N elements per lane allow: up to 16 bytes, else one element.
template <template <typename, int, int> class Launch, typename T, int N, typename Args>
void launch_width(const Args& a, cudaStream_t stream) {
  constexpr int kV = N < kVec<T> ? N : kVec<T>;
  const dim3 grid(static_cast<unsigned>(blocks_for(a.rows, kWarpsPerBlock)));
  const dim3 block(kWarpsPerBlock * kWarp);
  if (kV > 1 && chunks_fit<T>(a, kV)) {
    Launch<T, N, kV>::run(grid, block, a, stream);
  } else {
    Launch<T, N, 1>::run(grid, block, a, stream);
  }
}

// Each warp-path width covers 32 * N columns; pick the smallest that fits.
template <template <typename, int, int> class Launch, typename T, typename Args>
void dispatch_cols(const Args& a, cudaStream_t stream) {
  const int64_t n = (a.sk + kWarp - 1) / kWarp;
  if (n <= 1) return launch_width<Launch, T, 1>(a, stream);
  if (n <= 2) return launch_width<Launch, T, 2>(a, stream);
  if (n <= 4) return launch_width<Launch, T, 4>(a, stream);
  if (n <= 8) return launch_width<Launch, T, 8>(a, stream);
  if (n <= 16) return launch_width<Launch, T, 16>(a, stream);
  return launch_width<Launch, T, 32>(a, stream);
}

template <typename T>
cudaError_t fwd_typed(const SoftmaxFwdArgs& a, cudaStream_t stream) {
  if (a.sk <= kMaxWarpCols) {
    dispatch_cols<FwdWarp, T>(a, stream);
  } else {
    const unsigned grid = static_cast<unsigned>(blocks_for(a.rows, 1));
    if (chunks_fit<T>(a, kVec<T>)) {
      softmax_fwd_block<T, kVec<T>><<<grid, kBlockThreads, 0, stream>>>(a);
    } else {
      softmax_fwd_block<T, 1><<<grid, kBlockThreads, 0, stream>>>(a);
    }
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t bwd_typed(const SoftmaxBwdArgs& a, cudaStream_t stream) {
  if (a.sk <= kMaxWarpCols) {
    dispatch_cols<BwdWarp, T>(a, stream);
  } else {
    const unsigned grid = static_cast<unsigned>(blocks_for(a.rows, 1));
    if (chunks_fit<T>(a, kVec<T>)) {
      softmax_bwd_block<T, kVec<T>><<<grid, kBlockThreads, 0, stream>>>(a);
    } else {
      softmax_bwd_block<T, 1><<<grid, kBlockThreads, 0, stream>>>(a);
    }
  }
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
