// Softmax forward/backward kernels for fp32/fp16/bf16: each row read from HBM once, written once.
//
// Three designs, by row length and access width:
//
// Register rows (the backward; the forward of one-element accesses). A row of sk columns is
// spread over R = G * C threads: G threads of one CTA (G = 1 .. 32 lanes of a warp, several rows
// per warp, or G = 64 .. 512 threads, one row per CTA), and C = 1, 2, 4 or 8 CTAs of a
// thread-block cluster (sm_90) for rows of 16K to 128K columns, so that no thread holds more than
// 32 values (under a 64-register cap: 1024 threads per SM; the 512-thread and cluster shapes spill
// up to ~150 bytes a thread to L1). Thread t of the row holds K chunks of V consecutive columns,
// chunk k at columns (k * R + t) * V: each chunk is one 16-byte access per thread when sk and the
// pointers allow (V = 16 / sizeof(T)), else V = 1. Reductions go lane -> warp shuffle -> shared
// memory across the warps of a CTA -> distributed shared memory across the CTAs of a cluster.
// Grids are persistent (as many CTAs as stay resident); a CTA walks its rows with a stride and
// issues the next row's loads into a second set of registers before it reduces the current one.
// A persistent cluster grid is sized by the clusters that can be resident at once
// (cudaOccupancyMaxActiveClusters), not by SMs: clusters live inside one GPC.
//
// The direct forward (launch_direct): rows in 16-byte chunks (the common case) up to 16K
// fp16/bf16 or 512 fp32 columns. No persistent loop, no staging: each thread group loads its row
// into registers at once and the grid is as large as the rows need, so the hardware overlaps one
// CTA's loads with the arithmetic of others. fp16/bf16 values stay packed two to a register until
// the exponential (forward_row_packed), so that the kernel keeps up with HBM (benchmarks/runs/
// has the figures).
//
// The long forward (softmax_fwd_long, launch_long): longer rows in 16-byte chunks, copied into
// shared memory (one CTA a row up to 32K fp16/bf16 or 16K fp32 columns, clusters of 2..8 CTAs
// beyond), three passes over it.
//
// Rows longer than the largest configuration (128K columns, or clusters unavailable) take the
// two-pass block kernel at the end of this file, which has no length limit.
//
// Masking: columns at or past kept_prefix (causal modes) are never read and are written as 0; an
// explicit mask is read V bytes per chunk. A row whose every column is masked (or -inf) is written
// as zeros; a NaN poisons its row.
//
// Precision. fp16/bf16: the exponent works in base 2 with the scale folded in,
// exp2(fma(x, scale * log2 e, -max)) with the hardware's ex2 (relative error about 2^-22), in
// fp32, and the sums are fp32 (forward_row says more). fp32 data keep the accurate expf of an
// argument formed in double from the op's double scale, less the row's max of the same double
// product (te_fast_rules::exp_shifted, as on the CPU), and every sum of fp32 data is double. The
// final scaling y = e * (1 / sum) takes the double 1 / sum as a pair of floats (TimesInv): no
// double operation per element, and y is the correctly rounded fp32 product but for one ulp about
// twice in 10^8 (and in ~1% of the results under 2^-107; the CPU's double product is correctly
// rounded): the output keeps 24 bits. (A float-pair exp argument with Kahan sums was faster but
// doubled the fp32 error ratios.)
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels.h"
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
  __device__ __forceinline__ static void store(T* p, const float* in) {
    alignas(16) T e[V];
#pragma unroll
    for (int k = 0; k < V; ++k) e[k] = from_float<T>(in[k]);
    *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(e);
  }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  template <typename A>
  __device__ __forceinline__ A operator()(A a, A b) const {
    return a + b;
  }
};

// Shared memory of one reduction: a slot per warp of the CTA and one for the CTA's result,
// which the other CTAs of a cluster read.
template <typename A, int W>
struct Slots {
  A warp[W];
  A cta;
};

// Reduces v over the R = G * C threads of a row; every one of them gets the result, combined in
// the same fixed order everywhere (bitwise reproducible). Successive calls must use different
// Slots: the barrier of one call orders the previous call's reads before the next writes.
template <int G, int C, typename A, typename Op, int W>
__device__ __forceinline__ A row_reduce(A v, Op op, Slots<A, W>& s) {
  constexpr int kLanes = G < kWarp ? G : kWarp;
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if constexpr (G > kWarp) {
    if (threadIdx.x % kWarp == 0) s.warp[threadIdx.x / kWarp] = v;
    __syncthreads();
    v = s.warp[0];
#pragma unroll
    for (int w = 1; w < G / kWarp; ++w) v = op(v, s.warp[w]);
    if constexpr (C > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      if (threadIdx.x == 0) s.cta = v;
      cluster.sync();
      v = *cluster.map_shared_rank(&s.cta, 0);
#pragma unroll
      for (int r = 1; r < C; ++r) v = op(v, *cluster.map_shared_rank(&s.cta, r));
#else
      __trap();  // the host launches clusters only on sm_90 and newer
#endif
    }
  }
  return v;
}

// The two halves of a cluster barrier: arrive once done with the peers' shared memory, wait
// before this CTA's own may change (its next row, or its exit), with work in between.
template <int C>
__device__ __forceinline__ void cluster_arrive() {
  if constexpr (C > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
  }
}
template <int C>
__device__ __forceinline__ void cluster_wait() {
  if constexpr (C > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
  }
}

// The final barrier of a cluster kernel: no CTA may exit while another still reads its slots.
template <int C>
__device__ __forceinline__ void cluster_exit() {
  cluster_arrive<C>();
  cluster_wait<C>();
}

// One exchange per row between the C CTAs of a cluster, in place of cluster-wide barriers: each
// CTA sends its pair (max, sum) to every CTA of the cluster (st.async into the peer's slot, which
// completes a transaction on the peer's mbarrier) and waits on its own mbarrier until the C pairs
// of the row have landed. Rows alternate between two mbarriers and two sets of slots (parity), so
// that a fast CTA cannot overwrite a slot that a slow one has yet to read: a CTA sends its pair of
// row n + 2 only after it has received every pair of row n + 1, which each CTA sends after it has
// read its pairs of row n. The peers' mbarriers must be initialised before the first send: open()
// initialises them and arrives at a cluster barrier, whose wait swap takes before the first send
// (a CTA with no row takes it at its end).
template <int C>
struct Exchange {
  uint64_t bar[2];
  double2 slot[2][C];  // (max, sum) from each rank

  // At the kernel's start, in every thread.
  __device__ __forceinline__ void open() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&bar[p]))
                     : "memory");
      }
      asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
#endif
    cluster_arrive<C>();  // waited for before the first send: the peers' mbarriers are ready
  }
  // The n-th row of this CTA: sends (m, s) from rank `rank` and returns the C pairs in rank order.
  __device__ __forceinline__ const double2* swap(int64_t n, int rank, double m, double s) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (n == 0) cluster_wait<C>();  // the start barrier: every peer's mbarriers are initialised
    const int p = static_cast<int>(n & 1);
    const uint32_t parity = static_cast<uint32_t>(n >> 1) & 1u;
    const uint32_t my_bar = smem_addr(&bar[p]);
    if (threadIdx.x == 0) {  // this row's phase: one arrival and C pairs of 16 bytes
      uint64_t state;
      asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 %0, [%1], %2;\n"
                   : "=l"(state)
                   : "r"(my_bar), "r"(C * 16)
                   : "memory");
    }
    if (threadIdx.x < C) {  // thread r sends to rank r
      uint32_t peer_slot;
      uint32_t peer_bar;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                   : "=r"(peer_slot)
                   : "r"(smem_addr(&slot[p][rank])), "r"(threadIdx.x));
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                   : "=r"(peer_bar)
                   : "r"(my_bar), "r"(threadIdx.x));
      asm volatile(
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b64 [%0], {%1, %2}, [%3];\n" ::
              "r"(peer_slot),
          "l"(__double_as_longlong(m)), "l"(__double_as_longlong(s)), "r"(peer_bar)
          : "memory");
    }
    uint32_t done = 0;
    while (!done) {
      asm volatile(
          "{\n .reg .pred p;\n"
          " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
          " selp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(my_bar), "r"(parity)
          : "memory");
    }
    return slot[p];
#else
    __trap();  // the host launches clusters only on sm_90 and newer
    return nullptr;
#endif
  }
  // The sum over the cluster of one value per CTA (the n-th row of this CTA), added in rank
  // order: the bits of row_reduce's cluster step, without its cluster-wide barrier.
  template <typename A>
  __device__ __forceinline__ A sum(int64_t n, int rank, A v) {
    const double2* pairs = swap(n, rank, static_cast<double>(v), 0.0);
    A total = static_cast<A>(pairs[0].x);
#pragma unroll
    for (int r = 1; r < C; ++r) total += static_cast<A>(pairs[r].x);
    return total;
  }

 private:
  __device__ __forceinline__ static uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
  }
};

// One configuration: V columns per chunk, K chunks per thread, G threads of a CTA and C CTAs
// per row.
template <int V, int K, int G, int C>
struct Shape {
  static_assert(G <= kWarp || (G % kWarp == 0 && G <= kBlockThreads), "G: 1..32 or warps");
  static_assert(C == 1 || G == kBlockThreads, "clusters take whole 512-thread CTAs");
  static constexpr int kThreads = G <= kWarp ? kSubWarpCtaThreads : G;  // of one CTA
  static constexpr int kRowsPerCta = G <= kWarp ? kSubWarpCtaThreads / G : 1;
  static constexpr int kRowThreads = G * C;
  static constexpr int kWarps = G > kWarp ? G / kWarp : 1;
  static constexpr int64_t kCapacity = static_cast<int64_t>(kRowThreads) * K * V;
  // At least 1024 threads per SM (64 registers a thread at most): while one CTA reduces, another
  // one's loads are in flight.
  static constexpr int kMinCtasPerSm = 1024 / kThreads;

  // This thread's row of the CTA (sub-warp groups) and its position among the row's threads.
  __device__ __forceinline__ static int group() { return G <= kWarp ? threadIdx.x / G : 0; }
  __device__ __forceinline__ static int lane() {
    return (G <= kWarp ? threadIdx.x % G : threadIdx.x) + (C > 1 ? blockIdx.x % C : 0) * G;
  }
  __device__ __forceinline__ static int col(int k) { return (k * kRowThreads + lane()) * V; }
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

// ---------------------------------------------------------------- register-resident kernels
// The backward's CTAs stay resident and walk their rows with a stride (a persistent grid): before
// a thread reduces row r it has already issued the loads of its next row, so every thread keeps
// reads in flight through the reduction (two rows' chunks live in registers, as loaded). The
// forward holds one row (softmax_fwd_rows).

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

// Writes this thread's chunks of row `row` (unless it is past the end): y = e * inv, rounded
// once to fp32 (TimesInv: inv is double for fp32 data) and then to T.
template <typename T, int V, int K, int G, int C, typename A>
__device__ __forceinline__ void store_row(const SoftmaxFwdArgs& a, int64_t row, const float* v,
                                          A inv) {
  using S = Shape<V, K, G, C>;
  if (row >= a.rows) return;
  const TimesInv<A> times_inv(inv);
  T* y = static_cast<T*>(a.y) + row * a.sk;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j0 = S::col(k);
    if (j0 >= a.sk) continue;
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = times_inv(v[k * V + e]);
    Chunk<T, V>::store(y + j0, o);
  }
}

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

// forward_row's hot path (fp16/bf16 in 16-byte chunks, scale > 0) on packed words: a masked
// column's word lane is overwritten with -inf (one LOP3 per word), the thread's max is taken two
// columns per instruction, and each value is widened once, on its way into the exponential
// e = 2^fma(x, c, -fl(m * c)), whose -inf lanes give 0. The results are the same bits as
// forward_row's general path: the same max, the same e, summed in the same order.
template <typename T, int V, int K, int G, int C, typename ChunkAt, typename MaskedAt,
          typename MaxSlots, typename SumSlots>
__device__ __forceinline__ void forward_row_packed(const SoftmaxFwdArgs& a, int64_t row,
                                                   int limit, float c, ChunkAt chunk,
                                                   MaskedAt masked, MaxSlots& max_slots,
                                                   SumSlots& sum_slots) {
  using S = Shape<V, K, G, C>;
  using P = Packed<T>;
  constexpr int kW = V / 2;  // words per chunk
  uint32_t w[K * kW];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    packed_words<T, V>(S::col(k), limit, [&] { return chunk(k).raw; }, [&] { return masked(k); },
                       w + k * kW);
  }
  uint32_t m2 = w[0];
#pragma unroll
  for (int i = 1; i < K * kW; ++i) m2 = P::max2(m2, w[i]);
  float mx = fmaxf(P::lo(m2), P::hi(m2));
  mx = row_reduce<G, C>(mx, MaxOp{}, max_slots);
  float shift = mx == -INFINITY ? 0.f : mx * c;  // all kept scores -inf: every e is 0
  if (shift_coarse(mx, c)) {  // (rare) x -> x - mx, shift 0: e = 1 where x == mx, else 0
    const uint32_t mx2 = P::splat(mx);
#pragma unroll
    for (int i = 0; i < K * kW; ++i) w[i] = P::sub2(w[i], mx2);
    shift = 0.f;
  }
  float v[K * V];
  float part = 0.f;
#pragma unroll
  for (int i = 0; i < K * kW; ++i) {
    v[2 * i] = fast_exp2(fmaf(P::lo(w[i]), c, -shift));
    part += v[2 * i];
    v[2 * i + 1] = fast_exp2(fmaf(P::hi(w[i]), c, -shift));
    part += v[2 * i + 1];
  }
  const float sum = row_reduce<G, C>(part, SumOp{}, sum_slots);
  const float inv = sum == 0.f ? 0.f : 1.f / sum;  // fully masked row -> 0
  store_row<T, V, K, G, C>(a, row, v, inv);
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

// forward_row's general path: fp32 data, one-element chunks, scale <= 0 (see forward_row).
template <typename T, int V, int K, int G, int C, typename ChunkAt, typename MaskedAt,
          typename MaxSlots, typename SumSlots>
__device__ __forceinline__ void forward_row_general(const SoftmaxFwdArgs& a, int64_t row,
                                                    int limit, float c, ChunkAt chunk,
                                                    MaskedAt masked, MaxSlots& max_slots,
                                                    SumSlots& sum_slots) {
  using S = Shape<V, K, G, C>;
  using A = Acc<T>;
  constexpr int kE = K * V;
  constexpr uint32_t kFull = V == 32 ? 0xffffffffu : (1u << V) - 1u;
  static_assert(kE <= 32, "the kept-column bits of a thread are one 32-bit word");
  const bool fast = !kWide<T> && c > 0.f;  // uniform across the row
  // fp32 at scale > 0 (key 1): masked columns already hold -inf (below), which is their key * x,
  // so the max takes no select, and the exponential no keep_if: expf of -inf is the +0 it gives.
  const bool plain = fast || (kWide<T> && a.scale > 0.0);
  // the max loop's factor (not fast): fp16/bf16 at c <= 0 work in base e, as exp_of does
  const float key = kWide<T> ? wide_key(a.scale) : static_cast<float>(a.scale);
  float v[kE];
  uint32_t on = 0;  // bit k * V + e: column e of chunk k is kept
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j0 = S::col(k);
    float* w = v + k * V;
    if (j0 >= limit) {  // never loaded: wholly masked
#pragma unroll
      for (int e = 0; e < V; ++e) w[e] = -INFINITY;
      continue;
    }
    chunk(k).unpack(w);
    const uint32_t bits = kept_bits<V>(j0, limit, masked(k));
    on |= bits << (k * V);
    if (bits != kFull) {
#pragma unroll
      for (int e = 0; e < V; ++e) w[e] = bits >> e & 1u ? w[e] : -INFINITY;
    }
    if (plain) {
#pragma unroll
      for (int e = 0; e < V; ++e) mx = fmaxf(mx, w[e]);
    } else {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        mx = fmaxf(mx, bits >> e & 1u ? w[e] * key : -INFINITY);
      }
    }
  }
  mx = row_reduce<G, C>(mx, MaxOp{}, max_slots);
  // The exponent's shift. fp32: m is the max of key * x, the shift scale * m in double
  // (wide_shift). fp16/bf16: fl(m * c), the max of fl(x * c), when fast (c > 0); m itself, the
  // max of fl(x * scale), otherwise (a float held in the double exactly). All kept scores -inf:
  // every e is 0.
  double shift;
  if constexpr (kWide<T>) {
    shift = wide_shift(mx, a.scale);
  } else {
    float narrow = mx == -INFINITY ? 0.f : (fast ? mx * c : mx);
    if (fast && shift_coarse(mx, c)) {  // (rare) x -> x - mx, shift 0: e = 1 where x == mx
#pragma unroll
      for (int e = 0; e < kE; ++e) v[e] -= mx;
      narrow = 0.f;
    }
    shift = narrow;
  }
  A part = 0;
  if (fast) {
    const float narrow = static_cast<float>(shift);  // exact: shift was a float
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      v[e] = fast_exp2(fmaf(v[e], c, -narrow));
      part += v[e];
    }
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float* w = v + k * V;
      // A chunk never loaded (past the causal limit) has e = 0. (Not tested per one-element
      // chunk: that branch made the 16-bit one-element kernels spill 16-48 bytes.)
      if (V > 1 && S::col(k) >= limit) {
#pragma unroll
        for (int e = 0; e < V; ++e) w[e] = 0.f;
        continue;
      }
      if (kWide<T> && plain) {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          w[e] = exp_of<T>(w[e], c, shift, a.scale);
          part += w[e];
        }
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) {
          w[e] = keep_if(exp_of<T>(w[e], c, shift, a.scale), on, k * V + e);
          part += w[e];
        }
      }
    }
  }
  const A sum = row_reduce<G, C>(part, SumOp{}, sum_slots);
  const A inv = sum == A(0) ? A(0) : A(1) / sum;  // fully masked row -> 0
  store_row<T, V, K, G, C>(a, row, v, inv);
}

// The forward computation of one row from this thread's chunks, however they are held:
// chunk(k) gives chunk k as loaded, masked(k) its MaskChunk (explicit mask).
// Columns at or past `limit` are masked (causal modes; 0 for a row past the end, which takes
// part in the reductions and writes nothing). The values stay in registers from the first pass
// to the write.
//
// fp16/bf16 with scale > 0 (the hot path: few instructions per element, so that the kernel keeps
// up with HBM): masked columns become -inf, m = max x, e = 2^fma(x, c, -fl(m * c)) with
// c = scale * log2 e (a masked -inf gives 0), y = e / sum e. The fma forms x * c - fl(m * c)
// before rounding (shift_coarse: where fl(m * c) is too coarse for that). Otherwise (fp32 data,
// or scale <= 0) masked columns are tracked as bits and the max is taken of fl(x * scale)
// (fp16/bf16, in base e: exp_of) or of scale * x in double (fp32, through wide_key and
// wide_shift); fp32 takes the accurate expf of an argument
// formed in double (exp_shifted), with sums in double and the final scaling by the double
// 1 / sum split into two floats (TimesInv). fp32 at scale > 0 needs no bits: a masked column's
// -inf is its own key * x and its expf is +0.
template <typename T, int V, int K, int G, int C, typename ChunkAt, typename MaskedAt,
          typename MaxSlots, typename SumSlots>
__device__ __forceinline__ void forward_row(const SoftmaxFwdArgs& a, int64_t row, int limit,
                                            float c, ChunkAt chunk, MaskedAt masked,
                                            MaxSlots& max_slots, SumSlots& sum_slots) {
  if constexpr (!kWide<T> && V == kVec<T>) {
    // The host launches 16-byte fp16/bf16 kernels only where c > 0 (wide_chunks_ok): they hold the
    // packed path alone, so its registers are all theirs.
    forward_row_packed<T, V, K, G, C>(a, row, limit, c, chunk, masked, max_slots, sum_slots);
  } else {
    forward_row_general<T, V, K, G, C>(a, row, limit, c, chunk, masked, max_slots, sum_slots);
  }
}

// One thread's share of one forward row held in registers (the one-element-access path).
template <typename T, int V, int K, int G, int C, bool kMask>
struct FwdRow {
  using S = Shape<V, K, G, C>;
  Chunk<T, V> x[K];
  MaskChunk<V, kMask> m[K];
  int64_t row;
  int limit;

  __device__ __forceinline__ void fetch(const SoftmaxFwdArgs& a, int64_t r) {
    row = r;
    const bool live = r < a.rows;
    const RowPos p = live ? row_pos(a, r, kMask) : RowPos{0, nullptr};
    limit = live ? row_limit<kMask>(a, p) : 0;
    const T* src = static_cast<const T*>(a.x) + (live ? r : 0) * a.sk;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j0 = S::col(k);
      if (j0 < limit) {  // chunks wholly past the causal limit are never read
        x[k].load(src + j0);
        m[k].load(p.m + j0);
      }
    }
  }
};

// CTAs per SM the backward's register budget is sized for: a thread holds two rows of dy and y
// chunks (4 * K * V floats); up to 32 bytes of each per row it keeps the shape's 1024 threads per
// SM (64 registers), the longer fp32 shape (4 chunks of 4) takes one 512-thread CTA and 128.
template <typename T, int V, int K, int G, int C>
constexpr int kBwdMinCtasPerSm =
    K * V * static_cast<int>(sizeof(T)) > 32 ? 1 : Shape<V, K, G, C>::kMinCtasPerSm;

// Whether a cluster shape adds its CTAs' sums through an Exchange (one per row) rather than
// row_reduce's cluster-wide barrier: clusters of 8, but not the fp32 shapes under the 64-register
// budget, where the exchange's registers spilled (nvcc 13.0, sm_90). On clusters of 8 the
// exchange is faster than the barrier; on clusters of 2 and 4, where a cluster barrier is cheap,
// it is slower (python -m benchmarks; benchmarks/runs/ has the figures).
template <typename T, int V, int K, int G, int C>
constexpr bool kBwdExchange = C >= 8 && !(kWide<T> && kBwdMinCtasPerSm<T, V, K, G, C> > 1);

// One thread's share of one backward row.
template <typename T, int V, int K, int G, int C>
struct BwdRow {
  using S = Shape<V, K, G, C>;
  Chunk<T, V> g[K];  // dy
  Chunk<T, V> p[K];  // y
  int64_t row;

  __device__ __forceinline__ void fetch(const SoftmaxBwdArgs& a, int64_t r) {
    row = r;
    const bool live = r < a.rows;
    const int64_t offset = (live ? r : 0) * a.sk;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j0 = S::col(k);
      if (live && j0 < a.sk) {
        g[k].load(static_cast<const T*>(a.dy) + offset + j0);
        p[k].load(static_cast<const T*>(a.y) + offset + j0);
      } else {
        g[k].clear();
        p[k].clear();
      }
    }
  }

  // n: the rows this CTA has done before this one (the exchange's turn).
  template <typename SumSlots>
  __device__ __forceinline__ void process(const SoftmaxBwdArgs& a, SumSlots& sum_slots,
                                          Exchange<C>& xchg, int64_t n) const {
    Acc<T> part = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float gf[V];
      float pf[V];
      g[k].unpack(gf);
      p[k].unpack(pf);
#pragma unroll
      for (int e = 0; e < V; ++e) part += te_fast_rules::bwd_product<kWide<T>>(gf[e], pf[e]);
    }
    Acc<T> dot;
    if constexpr (kBwdExchange<T, V, K, G, C>) {
      const Acc<T> own = row_reduce<G, 1>(part, SumOp{}, sum_slots);
      dot = xchg.sum(n, static_cast<int>(blockIdx.x % C), own);
    } else {
      dot = row_reduce<G, C>(part, SumOp{}, sum_slots);
    }
    if (row >= a.rows) return;
    T* dx = static_cast<T*>(a.dx) + row * a.sk;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j0 = S::col(k);
      if (j0 >= a.sk) continue;
      float gf[V];
      float pf[V];
      g[k].unpack(gf);
      p[k].unpack(pf);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        gf[e] = te_fast_rules::bwd_element<kWide<T>>(gf[e], pf[e], dot, a.scale);
      }
      Chunk<T, V>::store(dx + j0, gf);
    }
  }
};

// Walks this thread's rows (uniform steps across each row's threads and the whole cluster),
// with the next row's loads issued before the current row is processed. Two Row objects take
// turns, so that no register copy waits on a load in flight.
template <int kRowsPerCta, int C, int G, typename Row, typename Args, typename Process>
__device__ __forceinline__ void pipelined_rows(const Args& a, Process process) {
  const int group = G <= kWarp ? threadIdx.x / G : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x / C) * kRowsPerCta;
  int64_t base = static_cast<int64_t>(blockIdx.x / C) * kRowsPerCta;
  Row r0;
  Row r1;
  r0.fetch(a, base + group);
  while (base < a.rows) {
    r1.fetch(a, base + stride + group);
    process(r0);
    base += stride;
    if (base >= a.rows) break;
    r0.fetch(a, base + stride + group);
    process(r1);
    base += stride;
  }
}

// One row at a time, held in registers: the one-element-access path (on a persistent grid), and
// the 16-byte path of rows up to 16K fp16/bf16 or 512 fp32 columns (launch_direct: a CTA per row
// group, the grid as large as the rows need). kSmThreads is the occupancy the register budget is
// sized for.
template <typename T, int V, int K, int G, int C, bool kMask, int kSmThreads>
__global__ void __launch_bounds__(Shape<V, K, G, C>::kThreads,
                                  kSmThreads / Shape<V, K, G, C>::kThreads)
    softmax_fwd_rows(SoftmaxFwdArgs a) {
  using S = Shape<V, K, G, C>;
  __shared__ Slots<float, S::kWarps> max_slots;
  __shared__ Slots<Acc<T>, S::kWarps> sum_slots;
  const float c = kWide<T> ? static_cast<float>(a.scale) : static_cast<float>(a.scale * kLog2e);
  const int64_t stride = static_cast<int64_t>(gridDim.x / C) * S::kRowsPerCta;
  for (int64_t base = static_cast<int64_t>(blockIdx.x / C) * S::kRowsPerCta; base < a.rows;
       base += stride) {
    FwdRow<T, V, K, G, C, kMask> r;
    r.fetch(a, base + S::group());
    forward_row<T, V, K, G, C>(
        a, r.row, r.limit, c, [&](int k) { return r.x[k]; }, [&](int k) { return r.m[k]; },
        max_slots, sum_slots);
  }
  cluster_exit<C>();
}

// cp.async (sm_80+): global -> shared without passing through registers.
template <int Bytes>
__device__ __forceinline__ void cp_async(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(Bytes)
                 : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- long rows in shared memory
// Rows of 16-byte chunks past what a thread group holds in registers: each row is split into C
// contiguous blocks of G * K chunks, one per CTA of a thread-block cluster (C = 1 .. 8), and a CTA
// copies its block into shared memory (cp.async, K chunks a thread, each thread its own slots) and
// works from there in three passes: the max, the sum of the exponentials, and the write of
// e * (1 / sum). The row's values do not live in registers between passes, so a thread may own
// many chunks and a CTA has its whole block in flight at once; the grid is one cluster per row
// (not persistent), so that while one CTA reduces, the SM's other CTAs keep their copies in flight
// (32 or 64 KiB a CTA: 192 KiB of loads per SM). An explicit mask is read into registers once
// the copies have landed and applied in the first pass: fp16/bf16 write the masked columns back
// as -inf (the later passes need no mask), fp32 keep the thread's kept-column bits in one word.
// fp16/bf16 recompute the exponential in the write pass (ex2.approx: the same bits as in the
// sum); fp32 keep each e in place of its x from the second pass (its accurate expf costs more
// than a shared-memory round trip). On one CTA the arithmetic is forward_row's: the same max, e
// and 1 / sum (the sums in another order). A cluster's CTAs work from their own block's max m_r
// and sum s_r and swap the pairs once (Exchange): the row's max M and sum S = sum of s_r
// 2^(m_r - M) (base 2 with the scale folded in for fp16/bf16, which then recompute e with M; fp32
// scale their stored e by exp(m_r - M) / S, in double). One swap a row is faster than the two
// cluster barriers a row it replaced (benchmarks/runs/).
// softmax_fwd_long's cold branch where shift_coarse (out of line, so that the hot passes keep
// their registers): x -> x - mx in the thread's chunks of the block in shared memory (the first
// `limit` columns of the block, those the causal cut keeps; the mask's -inf already in place).
template <typename T, int K, int G>
__device__ __noinline__ void minus_max_block(typename Chunk<T, kVec<T>>::R* xs, int t, int limit,
                                            float mx) {
  constexpr int V = kVec<T>;
  constexpr int kW = V / 2;
  using R = typename Chunk<T, V>::R;
  const uint32_t mx2 = Packed<T>::splat(mx);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int j0 = (k * G + t) * V;
    if (j0 >= limit) continue;
    alignas(16) uint32_t w[kW];
    packed_words<T, V>(j0, limit, [&] { return xs[k * G + t]; },
                       [] { return MaskChunk<V, false>{}; }, w);
#pragma unroll
    for (int i = 0; i < kW; ++i) w[i] = Packed<T>::sub2(w[i], mx2);
    xs[k * G + t] = *reinterpret_cast<const R*>(w);
  }
}

template <typename T, int K, int G, int C>
struct LongShape {
  static constexpr int V = kVec<T>;
  static constexpr int kCtaColumns = G * K * V;
  static constexpr int64_t kCapacity = static_cast<int64_t>(kCtaColumns) * C;
  static constexpr size_t kBytes = static_cast<size_t>(K) * G * 16;
  // CTAs an SM holds: by shared memory (227 KiB, 1 KiB reserved a CTA) and threads (2048); the
  // register budget is sized for them.
  static constexpr int kBySmem = static_cast<int>((227u << 10) / (kBytes + 1024));
  static constexpr int kMinCtasPerSm = kBySmem < 2048 / G ? kBySmem : 2048 / G;
};

template <typename T, int K, int G, int C, bool kMask>
__global__ void __launch_bounds__(G, (LongShape<T, K, G, C>::kMinCtasPerSm))
    softmax_fwd_long(SoftmaxFwdArgs a) {
  using L = LongShape<T, K, G, C>;
  constexpr int V = L::V;
  using R = typename Chunk<T, V>::R;
  static_assert(G % kWarp == 0 && G > kWarp && G <= 1024, "whole warps, more than one");
  extern __shared__ uint4 long_smem[];
  __shared__ Slots<float, G / kWarp> max_slots;
  __shared__ Slots<Acc<T>, G / kWarp> sum_slots;
  R* xs = reinterpret_cast<R*>(long_smem);  // [K][G]: chunk k of thread t at k * G + t
  const int t = threadIdx.x;
  const int rank = C > 1 ? static_cast<int>(blockIdx.x % C) : 0;
  const float c = kWide<T> ? static_cast<float>(a.scale) : static_cast<float>(a.scale * kLog2e);
  const int64_t stride = gridDim.x / C;
  // Clusters reduce each row through one Exchange: each CTA's max and sum first, then the row's.
  __shared__ Exchange<C> xchg;
  if constexpr (C > 1) xchg.open();
  int64_t n = 0;  // rows done by this CTA
  for (int64_t row = blockIdx.x / C; row < a.rows; row += stride, ++n) {
    const RowPos p = row_pos(a, row, kMask);
    const int limit = row_limit<kMask>(a, p);
    const int base = rank * L::kCtaColumns;
    const T* src = static_cast<const T*>(a.x) + row * a.sk;
    auto col = [&](int k) { return base + (k * G + t) * V; };
    MaskChunk<V, kMask> mask[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (col(k) < limit) {  // chunks wholly past the causal limit (or the row) are never read
        cp_async<sizeof(R)>(xs + k * G + t, src + col(k));
      }
    }
    cp_async_commit();
    cp_async_wait<0>();  // each slot is written and read by its own thread only: no barrier
    // The mask only now (its rows are mostly L2 hits: a mask row serves every head): read with
    // the copies, its registers were live across the wait, and the masked kernels spilled.
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (col(k) < limit) mask[k].load(p.m + col(k));
    }
    T* y = static_cast<T*>(a.y) + row * a.sk;
    if constexpr (!kWide<T>) {
      using P = Packed<T>;
      constexpr int kW = V / 2;
      auto at = [&](int k) { return xs[k * G + t]; };
      uint32_t m2 = P::kNegInf2;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        alignas(16) uint32_t w[kW];
        packed_words<T, V>(col(k), limit, [&] { return at(k); }, [&] { return mask[k]; }, w);
#pragma unroll
        for (int i = 0; i < kW; ++i) m2 = P::max2(m2, w[i]);
        if constexpr (kMask) {
          if (col(k) < limit) xs[k * G + t] = *reinterpret_cast<const R*>(w);  // masked: -inf
        }
      }
      const float mx = row_reduce<G, 1>(fmaxf(P::lo(m2), P::hi(m2)), MaxOp{}, max_slots);
      float shift = mx == -INFINITY ? 0.f : mx * c;  // as in forward_row_packed
      const bool own_coarse = shift_coarse(mx, c);
      if (own_coarse) {  // (rare) x -> x - mx, shift 0: this block's e = 1 where x == mx, else 0
        minus_max_block<T, K, G>(xs, t, limit - base, mx);
        shift = 0.f;
      }
      auto exps = [&](int k, float* e) {
        uint32_t w[kW];
        packed_words<T, V>(col(k), limit, [&] { return at(k); },
                           [] { return MaskChunk<V, false>{}; }, w);
#pragma unroll
        for (int i = 0; i < kW; ++i) {
          e[2 * i] = fast_exp2(fmaf(P::lo(w[i]), c, -shift));
          e[2 * i + 1] = fast_exp2(fmaf(P::hi(w[i]), c, -shift));
        }
      };
      float part = 0.f;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (col(k) >= limit) continue;  // its e are 0
        float e[V];
        exps(k, e);
#pragma unroll
        for (int i = 0; i < V; ++i) part += e[i];
      }
      float sum = row_reduce<G, 1>(part, SumOp{}, sum_slots);
      bool keep = true;  // false: this block's y are 0
      if constexpr (C > 1) {
        const double2* pairs = xchg.swap(n, rank, mx, sum);
        // The row's max M and sum: each CTA's sum of 2^(x c - m_r c) times 2^(m_r c - M c), in
        // rank order (every CTA computes the same bits). A block with no kept column sends sum 0.
        // Where fl(M c) is coarse (shift_coarse), that factor is 1 for the blocks whose max
        // is M, whose sums counted their columns equal to M, and 0 for the others. A block whose
        // own m_r c is coarse (<= -2^24) in a row that is not has a finite sum and the factor
        // 0. Such blocks, and those that do not hold M in a row that is coarse, write zeros: e
        // from their own shift (finite), times 0.
        float row_mx = -INFINITY;
#pragma unroll
        for (int r = 0; r < C; ++r) row_mx = fmaxf(row_mx, static_cast<float>(pairs[r].x));
        const float row_shift = row_mx == -INFINITY ? 0.f : row_mx * c;
        const bool row_coarse = shift_coarse(row_mx, c);
        float total = 0.f;
#pragma unroll
        for (int r = 0; r < C; ++r) {
          const float m_r = static_cast<float>(pairs[r].x);
          const float s_r = static_cast<float>(pairs[r].y);
          if (s_r == 0.f) continue;
          if (row_coarse) {
            total += m_r == row_mx ? s_r : 0.f;
          } else {
            total += s_r * fast_exp2((m_r == -INFINITY ? 0.f : m_r * c) - row_shift);
          }
        }
        if (!own_coarse && !row_coarse) shift = row_shift;
        keep = own_coarse ? row_coarse && mx == row_mx : !row_coarse;
        sum = total;
        if (row + stride >= a.rows) cluster_arrive<C>();  // its last row: the exit barrier
      }
      // fully masked row (or a block that keeps nothing) -> 0
      const TimesInv<float> times_inv(sum == 0.f || !keep ? 0.f : 1.f / sum);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (col(k) >= a.sk) continue;
        float e[V] = {};
        if (col(k) < limit) exps(k, e);
#pragma unroll
        for (int i = 0; i < V; ++i) e[i] = times_inv(e[i]);
        Chunk<T, V>::store(y + col(k), e);
      }
    } else {
      // fp32: forward_row_general's arithmetic (the max of key * x over kept columns and the
      // shift from it in double, wide_shift; the accurate expf of the double argument, double
      // sums, TimesInv<double>).
      static_assert(K * V <= 32, "the kept-column bits of a thread are one 32-bit word");
      const float key = wide_key(a.scale);
      uint32_t on = 0;  // bit k * V + e: column e of chunk k is kept
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (col(k) >= limit) continue;
        const uint32_t bits = kept_bits<V>(col(k), limit, mask[k]);
        on |= bits << (k * V);
        float v[V];
        Chunk<T, V>{xs[k * G + t]}.unpack(v);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          mx = fmaxf(mx, bits >> e & 1u ? v[e] * key : -INFINITY);  // a select, not a branch
        }
      }
      mx = row_reduce<G, 1>(mx, MaxOp{}, max_slots);
      const double shift = wide_shift(mx, a.scale);
      Acc<T> part = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (col(k) >= limit) continue;
        alignas(16) float v[V];
        Chunk<T, V>{xs[k * G + t]}.unpack(v);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          v[e] = keep_if(exp_of<T>(v[e], c, shift, a.scale), on, k * V + e);
          part += v[e];
        }
        xs[k * G + t] = *reinterpret_cast<const R*>(v);  // e in place of x
      }
      const Acc<T> sum = row_reduce<G, 1>(part, SumOp{}, sum_slots);
      Acc<T> inv = sum == Acc<T>(0) ? Acc<T>(0) : Acc<T>(1) / sum;  // fully masked row -> 0
      if constexpr (C > 1) {
        // This CTA's e are exp(x * scale - m_r): y = e * exp(m_r - M) / S, with the row's max M
        // and sum S = sum over ranks of s_r * exp(m_r - M) (double, in rank order). m_r is this
        // CTA's shift, -inf where it keeps no column.
        const double2* pairs = xchg.swap(n, rank, mx == -INFINITY ? -INFINITY : shift, sum);
        double row_mx = -INFINITY;
#pragma unroll
        for (int r = 0; r < C; ++r) row_mx = fmax(row_mx, pairs[r].x);
        double total = 0.0;
        double own = 0.0;
#pragma unroll 1
        for (int r = 0; r < C; ++r) {  // one exp at a time: unrolled, they spilled
          const double f = pairs[r].y != 0.0 ? exp(pairs[r].x - row_mx) : 0.0;
          total += pairs[r].y * f;
          if (r == rank) own = f;
        }
        inv = total == 0.0 ? 0.0 : own / total;
        if (row + stride >= a.rows) cluster_arrive<C>();  // its last row: the exit barrier
      }
      const TimesInv<Acc<T>> times_inv(inv);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (col(k) >= a.sk) continue;
        float e[V] = {};
        if (col(k) < limit) Chunk<T, V>{xs[k * G + t]}.unpack(e);
#pragma unroll
        for (int i = 0; i < V; ++i) e[i] = times_inv(e[i]);
        Chunk<T, V>::store(y + col(k), e);
      }
    }
  }
  if constexpr (C > 1) {
    if (n == 0) {  // no row: the start barrier, then this CTA's arrival at the exit barrier
      cluster_wait<C>();
      cluster_arrive<C>();
    }
    cluster_wait<C>();  // no CTA exits while a peer may still send to it
  }
}

// One reduction per row: successive rows take turns between two Slots, so that no thread writes
// a slot that another one still reads for the previous row. Clusters of 8 add the CTAs' sums
// through one Exchange per row (as softmax_fwd_long does; kBwdExchange), the others through
// row_reduce's cluster-wide barrier.
template <typename T, int V, int K, int G, int C, bool kUnused>
__global__ void __launch_bounds__(Shape<V, K, G, C>::kThreads, kBwdMinCtasPerSm<T, V, K, G, C>)
    softmax_bwd_rows(SoftmaxBwdArgs a) {
  using S = Shape<V, K, G, C>;
  __shared__ Slots<Acc<T>, S::kWarps> sum_slots[2];
  __shared__ Exchange<C> xchg;
  constexpr bool kExchange = kBwdExchange<T, V, K, G, C>;
  if constexpr (kExchange) xchg.open();
  int64_t n = 0;  // rows done by this CTA
  pipelined_rows<S::kRowsPerCta, C, G, BwdRow<T, V, K, G, C>>(
      a, [&](const BwdRow<T, V, K, G, C>& r) {
        r.process(a, sum_slots[n & 1], xchg, n);
        ++n;
      });
  if constexpr (kExchange) {
    if (n == 0) cluster_wait<C>();  // no row: the start barrier
  }
  cluster_exit<C>();  // no CTA exits while a peer may still send to it
}

// ---------------------------------------------------------------- two-pass kernels (any length)
// One CTA per row; thread t takes the chunks from t * V, t * V + blockDim.x * V, ... The forward
// makes one online (max, sum) pass and one write pass, the backward one dot-product pass and one
// write pass; the second pass re-reads the row (from L2 when it is still there).

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

template <typename T, int V>
__global__ void __launch_bounds__(kBlockThreads) softmax_bwd_block(SoftmaxBwdArgs a) {
  __shared__ Slots<Acc<T>, kBlockThreads / kWarp> slots;
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* dy = static_cast<const T*>(a.dy) + row * a.sk;
    const T* y = static_cast<const T*>(a.y) + row * a.sk;
    auto load_pair = [&](int64_t j0, float* g, float* p) {  // dy and y at columns j0 ..
      Chunk<T, V> cg;
      Chunk<T, V> cp;
      cg.load(dy + j0);
      cp.load(y + j0);
      cg.unpack(g);
      cp.unpack(p);
    };
    Acc<T> part = 0;
    for (int64_t j0 = threadIdx.x * V; j0 < a.sk; j0 += step) {
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
      float g[V];
      float p[V];
      load_pair(j0, g, p);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        g[e] = te_fast_rules::bwd_element<kWide<T>>(g[e], p[e], dot, a.scale);
      }
      Chunk<T, V>::store(dx + j0, g);
    }
  }
}

// ---------------------------------------------------------------- launch

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

// Forward and backward share the dispatch: Kernel<T, V, K, G, C, kMask>::get() names the kernel.
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
template <typename T, int V, int K, int G, int C, bool kMask>
struct BwdKernel {
  static auto get() { return softmax_bwd_rows<T, V, K, G, C, kMask>; }
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
template <typename T>
bool launch_long_fp32_bwd(const SoftmaxBwdArgs& a, cudaStream_t stream, cudaError_t& err) {
  if constexpr (kWide<T>) {
    return clusters_supported() &&
           try_shape<BwdKernel, T, kVec<T>, 4, 512, 8, false>(a, stream, err);
  } else {
    return false;
  }
}

template <typename T>
cudaError_t softmax_bwd_typed(const SoftmaxBwdArgs& a, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (chunks_fit<T>(a, kVec<T>)) {
    if (launch_registers<BwdKernel, T, kVec<T>, 2, false>(a, stream, err) ||
        launch_long_fp32_bwd<T>(a, stream, err)) {
      return err;
    }
    return launch_block(softmax_bwd_block<T, kVec<T>>, a, stream);
  }
  if (launch_registers<BwdKernel, T, 1, 8, false>(a, stream, err)) return err;
  return launch_block(softmax_bwd_block<T, 1>, a, stream);
}

}  // namespace softmax_detail
}  // namespace te_fast_kernels
