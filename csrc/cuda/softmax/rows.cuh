// Register rows: the backward (softmax_bwd_rows), the forward of one-element accesses and the
// direct forward of 16-byte chunks (softmax_fwd_rows). Each thread holds its share of a row in
// registers from the load to the write.
//
// A row of sk columns is spread over R = G * C threads: G threads of one CTA (G = 1 .. 32 lanes of
// a warp, several rows per warp, or G = 64 .. 512 threads, one row per CTA), and C = 1, 2, 4 or 8
// CTAs of a thread-block cluster (sm_90) for rows of 16K to 128K columns, so that no thread holds
// more than 32 values (under a 64-register cap: 1024 threads per SM; the 512-thread and cluster
// shapes spill up to ~150 bytes a thread to L1). Thread t of the row holds K chunks of V
// consecutive columns, chunk k at columns (k * R + t) * V: each chunk is one 16-byte access per
// thread when sk and the pointers allow (V = 16 / sizeof(T)), else V = 1. Reductions go through
// row_reduce (reduce.cuh).
//
// The backward and the one-element forward run on persistent grids (as many CTAs as stay
// resident; a persistent cluster grid is sized by the clusters that can be resident at once,
// cudaOccupancyMaxActiveClusters, not by SMs: clusters live inside one GPC). A CTA walks its rows
// with a stride; the backward issues the loads of its next row into a second set of registers
// before it reduces the current one, so every thread keeps reads in flight through the reduction
// (two rows' chunks live in registers, as loaded). The forward holds one row.
//
// The direct forward (launch_direct, launch.cuh): rows in 16-byte chunks (the common case) up to
// 16K fp16/bf16 or 512 fp32 columns. No persistent loop, no staging: each thread group loads its
// row into registers at once and the grid is as large as the rows need, so the hardware overlaps
// one CTA's loads with the arithmetic of others. fp16/bf16 values stay packed two to a register
// until the exponential (forward_row_packed), so that the kernel keeps up with HBM
// (benchmarks/runs/ has the figures).
#pragma once

#include <cstdint>

#include "chunks.cuh"
#include "common.cuh"
#include "reduce.cuh"

namespace te_fast_kernels {
namespace softmax_detail {

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

// One thread's share of one backward row. kCausal (the causal modes): only the row's kept prefix
// of dy and y is loaded (columns j < limit); a chunk that straddles the limit has its elements
// past it set to +0 on its raw words (Chunk::first) before they enter the dot, so that dx there
// is 0 (x + 0 makes its sign +), and chunks wholly past it are written as 16-byte zero stores
// (docs/SPEC.md §3: dy and y there are not read, dx there is +0). A chunk past sk is never
// loaded or written.
template <typename T, int V, int K, int G, int C, bool kCausal>
struct BwdRow {
  using S = Shape<V, K, G, C>;
  Chunk<T, V> g[K];  // dy
  Chunk<T, V> p[K];  // y
  int64_t row;
  int limit;  // kCausal: columns j < limit are read (0 for a row past the end)

  __device__ __forceinline__ void fetch(const SoftmaxBwdArgs& a, int64_t r) {
    row = r;
    const bool live = r < a.rows;
    if constexpr (kCausal) limit = live ? static_cast<int>(bwd_limit<true>(a, r)) : 0;
    const int64_t offset = (live ? r : 0) * a.sk;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j0 = S::col(k);
      if (kCausal ? j0 < limit : live && j0 < a.sk) {
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
                                          Exchange<C>& xchg, int64_t n) {
    if constexpr (kCausal) {  // a straddling chunk's elements past the limit: +0, in place
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int kept = limit - S::col(k);
        if (kept < V) {
          g[k] = g[k].first(kept);
          p[k] = p[k].first(kept);
        }
      }
    }
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
      if (kCausal && j0 >= limit) {  // wholly past the kept prefix: a 16-byte (V-element) fill
        Chunk<T, V>::store_zero(dx + j0);
        continue;
      }
      float gf[V];
      float pf[V];
      g[k].unpack(gf);
      p[k].unpack(pf);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        gf[e] = te_fast_rules::bwd_element<kWide<T>>(gf[e], pf[e], dot, a.scale);
        // Past the kept prefix dy and y are +0 here, and so is dx but for its sign: x + 0
        // turns -0 into +0 and leaves every other value as it is.
        if constexpr (kCausal) gf[e] += 0.f;
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

// One reduction per row: successive rows take turns between two Slots, so that no thread writes
// a slot that another one still reads for the previous row. Clusters of 8 add the CTAs' sums
// through one Exchange per row (as softmax_fwd_long does; kBwdExchange), the others through
// row_reduce's cluster-wide barrier.
// kCausal: the causal modes (BwdRow).
template <typename T, int V, int K, int G, int C, bool kCausal>
__global__ void __launch_bounds__(Shape<V, K, G, C>::kThreads, kBwdMinCtasPerSm<T, V, K, G, C>)
    softmax_bwd_rows(SoftmaxBwdArgs a) {
  using S = Shape<V, K, G, C>;
  __shared__ Slots<Acc<T>, S::kWarps> sum_slots[2];
  __shared__ Exchange<C> xchg;
  constexpr bool kExchange = kBwdExchange<T, V, K, G, C>;
  if constexpr (kExchange) xchg.open();
  int64_t n = 0;  // rows done by this CTA
  pipelined_rows<S::kRowsPerCta, C, G, BwdRow<T, V, K, G, C, kCausal>>(
      a, [&](BwdRow<T, V, K, G, C, kCausal>& r) {
        r.process(a, sum_slots[n & 1], xchg, n);
        ++n;
      });
  if constexpr (kExchange) {
    if (n == 0) cluster_wait<C>();  // no row: the start barrier
  }
  cluster_exit<C>();  // no CTA exits while a peer may still send to it
}

}  // namespace softmax_detail
}  // namespace te_fast_kernels
