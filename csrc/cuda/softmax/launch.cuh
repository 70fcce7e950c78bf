// The host side of the softmax kernels: which kernel and shape a row takes (the register rows,
// the direct and long forwards, the two-pass kernels), the grid it is launched on, and the typed
// entry points softmax_fwd_typed and softmax_bwd_typed that softmax_<dir>_<dtype>.cu instantiate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "long_rows.cuh"
#include "rows.cuh"
#include "two_pass.cuh"

namespace te_fast_kernels {
namespace softmax_detail {

inline bool aligned(const void* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Whether every row can be read and written V elements at a time: whole chunks per row, and
// each tensor's start aligned to a chunk (rows then are too).
template <typename T>
bool chunks_fit(const SoftmaxFwdArgs& a, int v) {
  const int bytes = v * static_cast<int>(sizeof(T));
  const bool mask_ok = a.mode != te_fast_rules::kExplicitMask || aligned(a.mask, v);
  return a.sk % v == 0 && aligned(a.x, bytes) && aligned(a.y, bytes) && mask_ok;
}

template <typename T>
bool chunks_fit(const SoftmaxBwdArgs& a, int v) {
  const int bytes = v * static_cast<int>(sizeof(T));
  return a.sk % v == 0 && aligned(a.dy, bytes) && aligned(a.y, bytes) && aligned(a.dx, bytes);
}

// Thread-block clusters (sm_90+) carry the longest register-resident rows.
inline bool clusters_supported() {
  int device = 0;
  int major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  return major >= 9;
}

// Raises the kernel's dynamic shared memory limit to what it uses, once: dynamic plus static
// shared memory may pass the default 48 KiB.
template <typename Kn, typename Kernel>
void allow_smem(Kernel kernel, size_t smem) {
  static bool done = false;  // one per kernel (Kn)
  if (!done && smem > 0) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  }
  done = true;
}

// CTAs of `kernel` that one SM holds at once (cached per kernel: the query is not free).
// The first call also raises the kernel's dynamic shared memory limit to what it uses.
template <typename Kn, typename Kernel>
int resident_ctas_per_sm(Kernel kernel, int threads, size_t smem) {
  static int cached = 0;  // one per kernel (Kn); the same for every device of one architecture
  if (cached == 0) {
    allow_smem<Kn>(kernel, smem);
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
      n = 1;
    }
    cached = n > 0 ? n : 1;
  }
  return cached;
}

inline int sm_count() {
  int device = 0;
  int n = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 1;
  }
  return n;
}

template <typename Kn>
constexpr bool persistent(decltype(Kn::kPersistent)) {
  return Kn::kPersistent;
}
template <typename Kn>
constexpr bool persistent(...) {
  return true;
}

// A persistent grid: as many CTAs (whole clusters) as stay resident, never more than the rows
// need.
template <typename Kn, typename Args>
cudaError_t launch_rows(int rows_per_cta, int threads, int cluster, const Args& a,
                        cudaStream_t stream) {
  const auto kernel = Kn::get();
  const size_t smem = Kn::smem();
  const int64_t needed = (a.rows + rows_per_cta - 1) / rows_per_cta;  // CTAs (or clusters)
  constexpr bool kPersistent = persistent<Kn>(0);
  if (!kPersistent) allow_smem<Kn>(kernel, smem);
  if (cluster == 1) {
    int64_t units = needed;
    if (kPersistent) {
      const int64_t resident =
          static_cast<int64_t>(sm_count()) * resident_ctas_per_sm<Kn>(kernel, threads, smem);
      units = needed < resident ? needed : (resident > 0 ? resident : 1);
    }
    units = units < kMaxCtas ? units : kMaxCtas;
    kernel<<<static_cast<unsigned>(units), threads, smem, stream>>>(a);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t config = {};
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  int64_t units = needed;
  if (kPersistent) {
    // Clusters must fit in one GPC: fewer of them are resident at once than SMs * CTAs per SM /
    // cluster suggests, and a persistent grid larger than that would run a second, mostly idle
    // wave.
    static int resident = 0;  // one per kernel (Kn)
    if (resident == 0) {
      const int per_sm = resident_ctas_per_sm<Kn>(kernel, threads, smem);
      config.gridDim = dim3(static_cast<unsigned>(cluster));
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        n = sm_count() * per_sm / cluster;
      }
      resident = n > 0 ? n : 1;
    }
    units = needed < resident ? needed : resident;
  }
  units = units < kMaxCtas ? units : kMaxCtas;
  config.gridDim = dim3(static_cast<unsigned>(units * cluster));
  return cudaLaunchKernelEx(&config, kernel, a);
}

// Forward and backward share the dispatch: Kernel<T, V, K, G, C, kMask>::get() names the kernel
// (the backward's flag is kCausal).
template <typename T, int V, int K, int G, int C, bool kMask>
struct FwdKernel {
  static auto get() { return softmax_fwd_rows<T, V, K, G, C, kMask, 1024>; }
  static size_t smem() { return 0; }
};
template <int kSmThreads>
struct FwdDirect {
  template <typename T, int V, int K, int G, int C, bool kMask>
  struct Kernel {
    static constexpr bool kPersistent = false;
    static auto get() { return softmax_fwd_rows<T, V, K, G, C, kMask, kSmThreads>; }
    static size_t smem() { return 0; }
  };
};
template <typename T, int K, int G, int C, bool kMask>
struct FwdLong {
  static constexpr bool kPersistent = false;
  static auto get() { return softmax_fwd_long<T, K, G, C, kMask>; }
  static size_t smem() { return LongShape<T, K, G, C>::kBytes; }
};
template <typename T, int V, int K, int G, int C, bool kCausal>
struct BwdKernel {
  static auto get() { return softmax_bwd_rows<T, V, K, G, C, kCausal>; }
  static size_t smem() { return 0; }
};

// Launches configuration (V, K, G, C) when it holds a row of sk columns; false otherwise.
template <template <typename, int, int, int, int, bool> class Kernel, typename T, int V, int K,
          int G, int C, bool kMask, typename Args>
bool try_shape(const Args& a, cudaStream_t stream, cudaError_t& err) {
  using S = Shape<V, K, G, C>;
  if (a.sk > S::kCapacity) return false;
  using Kn = Kernel<T, V, K, G, C, kMask>;
  err = launch_rows<Kn>(S::kRowsPerCta, S::kThreads, C, a, stream);
  return true;
}

// The configurations of V columns per chunk and at most KMax chunks per thread, smallest first.
// A thread takes up to KMax chunks before a row spreads over more threads (more loads in flight,
// fewer shuffles): one thread for a row of one chunk, two for up to 2 * KMax chunks, then 4 .. 32
// lanes of a warp, then one CTA of 64 .. 512 threads, then clusters of 2, 4 and 8 such CTAs.
// Each row takes the smallest that holds it.
template <template <typename, int, int, int, int, bool> class Kernel, typename T, int V, int KMax,
          bool kMask, typename Args>
bool launch_registers(const Args& a, cudaStream_t stream, cudaError_t& err) {
  constexpr int K = KMax;
  if constexpr (V > 1) {
    // Two threads per row at least once a row has two chunks: a warp's access then covers whole
    // 32-byte sectors (one thread per row would touch half of one sector per row and access).
    if (try_shape<Kernel, T, V, 1, 1, 1, kMask>(a, stream, err)) return true;
    if constexpr (K >= 4) {
      if (try_shape<Kernel, T, V, K / 4, 2, 1, kMask>(a, stream, err)) return true;
    }
    if constexpr (K >= 2) {
      if (try_shape<Kernel, T, V, K / 2, 2, 1, kMask>(a, stream, err)) return true;
    }
    if (try_shape<Kernel, T, V, K, 2, 1, kMask>(a, stream, err) ||
        try_shape<Kernel, T, V, K, 4, 1, kMask>(a, stream, err) ||
        try_shape<Kernel, T, V, K, 8, 1, kMask>(a, stream, err) ||
        try_shape<Kernel, T, V, K, 16, 1, kMask>(a, stream, err)) {
      return true;
    }
  } else {  // one element per access is the fallback path: fewer shapes
    if (try_shape<Kernel, T, V, K, 1, 1, kMask>(a, stream, err) ||
        try_shape<Kernel, T, V, K, 8, 1, kMask>(a, stream, err)) {
      return true;
    }
  }
  if (try_shape<Kernel, T, V, K, 32, 1, kMask>(a, stream, err) ||
      try_shape<Kernel, T, V, K, 64, 1, kMask>(a, stream, err) ||
      try_shape<Kernel, T, V, K, 128, 1, kMask>(a, stream, err) ||
      try_shape<Kernel, T, V, K, 256, 1, kMask>(a, stream, err) ||
      try_shape<Kernel, T, V, K, 512, 1, kMask>(a, stream, err)) {
    return true;
  }
  if (!clusters_supported()) return false;
  return try_shape<Kernel, T, V, K, 512, 2, kMask>(a, stream, err) ||
         try_shape<Kernel, T, V, K, 512, 4, kMask>(a, stream, err) ||
         try_shape<Kernel, T, V, K, 512, 8, kMask>(a, stream, err);
}

template <typename Args, typename Kernel>
cudaError_t launch_block(Kernel kernel, const Args& a, cudaStream_t stream) {
  const int64_t ctas = a.rows < kMaxCtas ? a.rows : kMaxCtas;
  kernel<<<static_cast<unsigned>(ctas), kBlockThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// Chunks per thread of the register rows, under the 64-register cap: a forward thread of
// one-element chunks holds one row of 16 fp16/bf16 or 8 fp32 values; a backward thread holds two
// rows of 2 chunks of dy and y each (8 values of each for one-element chunks). The 512-thread and
// cluster shapes spill a little.

// Rows of 16-byte chunks up to 16K fp16/bf16 or 512 fp32 columns: one row per thread group of one
// CTA, all of its chunks loaded at once into registers, the grid as large as the rows need (the
// hardware overlaps one CTA's loads with another's arithmetic). Longer rows take the long kernel
// (launch_long).
//
// fp16/bf16: up to 2048 columns two chunks a thread (16 values, 40 registers: 1536 threads per
// SM; rows of one warp or less with a mask take 1024, where 40 registers spill), beyond that four
// (64 registers, 1024 threads). This design is faster than a persistent staged kernel up to 16K
// columns, and faster there than the long kernel on one CTA; on clusters (32K, 64K) it is
// slower than a staged kernel, so longer rows take the long kernel. Masked rows find their
// position by Divisor's multiply and shift, faster than two 32-bit divisions (python -m
// benchmarks; benchmarks/runs/ has the figures).
//
// fp32 (the general row path: double sums, no packed words): two chunks a thread (8 values; every
// shape, masked or not, fits 40 registers without spilling under nvcc 13.0 for sm_90: 1536
// threads per SM). Divisor matters more here: divisions would share the conversion and MUFU
// pipes with expf. From 1K columns on the long kernel is faster (see launch_long): with the same
// arithmetic it reaches a far larger share of the DRAM peak (ncu), so what holds this one back is
// the bytes a thread keeps in flight, not its instruction stream.
// Tries the direct kernel at kSmThreads with K chunks a thread on G threads a row, for each G in
// turn (smallest first).
template <typename T, bool kMask, int kSmThreads, int K, int... Gs>
bool try_direct(const SoftmaxFwdArgs& a, cudaStream_t stream, cudaError_t& err) {
  using D = FwdDirect<kSmThreads>;
  return (try_shape<D::template Kernel, T, kVec<T>, K, Gs, 1, kMask>(a, stream, err) || ...);
}

template <typename T, bool kMask>
bool launch_direct(const SoftmaxFwdArgs& a, cudaStream_t stream, cudaError_t& err) {
  if constexpr (kWide<T>) {
    return try_direct<T, kMask, 1536, 1, 1, 2>(a, stream, err) ||
           try_direct<T, kMask, 1536, 2, 2, 4, 8, 16, 32, 64>(a, stream, err);
  } else {
    constexpr int kShort = kMask ? 1024 : 1536;  // rows of a warp or less
    return try_direct<T, kMask, kShort, 1, 1, 2>(a, stream, err) ||
           try_direct<T, kMask, kShort, 2, 2, 4, 8, 16, 32>(a, stream, err) ||
           try_direct<T, kMask, 1536, 2, 64, 128>(a, stream, err) ||
           try_direct<T, kMask, 1024, 4, 128, 256, 512>(a, stream, err);
  }
}

// Rows past the direct kernel: softmax_fwd_long on clusters of C = 1, 2, 4, 8 CTAs of G threads
// with K chunks a thread, the first that holds the row.
template <typename T, bool kMask, int K, int G, int... Cs>
bool try_long(const SoftmaxFwdArgs& a, cudaStream_t stream, cudaError_t& err) {
  auto one = [&](auto c) {
    constexpr int C = decltype(c)::value;
    if (a.sk > LongShape<T, K, G, C>::kCapacity || (C > 1 && !clusters_supported())) {
      return false;
    }
    err = launch_rows<FwdLong<T, K, G, C, kMask>>(1, G, C, a, stream);
    return true;
  };
  return (one(std::integral_constant<int, Cs>{}) || ...);
}

// The long kernel's shapes, the first that holds the row: one CTA (no cluster) wherever 64 KiB
// of shared memory hold the row, since each doubling of the cluster costs several points of the
// copy ceiling: bf16 32K on one 512-thread CTA of 8 chunks a thread beats two 256-thread or four
// 128-thread CTAs, and 64K on two such CTAs beats one 1024-thread CTA of 128 KiB. fp32 takes
// this kernel from 1K columns on, where it beats the direct kernel (masked rows most): the direct
// kernel holds 48 KiB of a row per SM in registers, the long kernel's CTAs up to 208 KiB (python
// -m benchmarks; benchmarks/runs/ has the figures).
template <typename T, bool kMask>
bool launch_long(const SoftmaxFwdArgs& a, cudaStream_t stream, cudaError_t& err) {
  if constexpr (kWide<T>) {
    return try_long<T, kMask, 4, 64, 1>(a, stream, err) ||   // 1K columns
           try_long<T, kMask, 4, 128, 1>(a, stream, err) ||  // 2K
           try_long<T, kMask, 8, 128, 1>(a, stream, err) ||  // 4K
           try_long<T, kMask, 8, 256, 1>(a, stream, err) ||  // 8K
           try_long<T, kMask, 8, 512, 1, 2, 4, 8>(a, stream, err);  // 16K .. 128K
  } else {
    return try_long<T, kMask, 8, 512, 1, 2, 4>(a, stream, err);  // 32K .. 128K
  }
}

// Whether a row may take the 16-byte kernels: fp16/bf16 ones hold only the packed path, which
// needs c = fl(scale * log2 e) > 0 (the kernels' own expression); any other scale takes the
// one-element kernels and their general path.
template <typename T>
bool wide_chunks_ok(const SoftmaxFwdArgs& a) {
  return chunks_fit<T>(a, kVec<T>) && (kWide<T> || static_cast<float>(a.scale * kLog2e) > 0.f);
}

template <typename T, bool kMask>
cudaError_t softmax_fwd_masked(const SoftmaxFwdArgs& a, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (wide_chunks_ok<T>(a)) {
    constexpr int V = kVec<T>;
    // Rows past the direct kernel (16K fp16/bf16 columns, 512 fp32): the long kernel; past
    // 128K columns the two-pass kernel.
    if (launch_direct<T, kMask>(a, stream, err) || launch_long<T, kMask>(a, stream, err)) {
      return err;
    }
    return launch_block(softmax_fwd_block<T, V>, a, stream);
  }
  if (launch_registers<FwdKernel, T, 1, kWide<T> ? 8 : 16, kMask>(a, stream, err)) return err;
  return launch_block(softmax_fwd_block<T, 1>, a, stream);
}

template <typename T>
cudaError_t softmax_fwd_typed(const SoftmaxFwdArgs& args, cudaStream_t stream) {
  SoftmaxFwdArgs a = args;
  if (a.mode != te_fast_rules::kNoMask) {  // heads * sq <= rows
    a.by_sq = make_divisor(a.sq);
    a.by_head_rows = make_divisor(a.heads * a.sq);
  }
  if (a.mode == te_fast_rules::kExplicitMask) return softmax_fwd_masked<T, true>(a, stream);
  return softmax_fwd_masked<T, false>(a, stream);
}

// fp32 rows of 32K..64K columns: one more cluster shape, four chunks of dy and y a thread (the
// two-pass kernel reads every row twice).
template <typename T, bool kCausal>
bool launch_long_fp32_bwd(const SoftmaxBwdArgs& a, cudaStream_t stream, cudaError_t& err) {
  if constexpr (kWide<T>) {
    return clusters_supported() &&
           try_shape<BwdKernel, T, kVec<T>, 4, 512, 8, kCausal>(a, stream, err);
  } else {
    return false;
  }
}

// kCausal: the causal modes, whose kernels read and compute only each row's kept prefix (BwdRow).
template <typename T, bool kCausal>
cudaError_t softmax_bwd_rows_of(const SoftmaxBwdArgs& a, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (chunks_fit<T>(a, kVec<T>)) {
    if (launch_registers<BwdKernel, T, kVec<T>, 2, kCausal>(a, stream, err) ||
        launch_long_fp32_bwd<T, kCausal>(a, stream, err)) {
      return err;
    }
    return launch_block(softmax_bwd_block<T, kVec<T>, kCausal>, a, stream);
  }
  if (launch_registers<BwdKernel, T, 1, 8, kCausal>(a, stream, err)) return err;
  return launch_block(softmax_bwd_block<T, 1, kCausal>, a, stream);
}

template <typename T>
cudaError_t softmax_bwd_typed(const SoftmaxBwdArgs& args, cudaStream_t stream) {
  if (args.mode == te_fast_rules::kTopLeftCausal || args.mode == te_fast_rules::kBottomRightCausal) {
    SoftmaxBwdArgs a = args;
    a.by_sq = make_divisor(a.sq);
    return softmax_bwd_rows_of<T, true>(a, stream);
  }
  return softmax_bwd_rows_of<T, false>(args, stream);
}

}  // namespace softmax_detail
}  // namespace te_fast_kernels
