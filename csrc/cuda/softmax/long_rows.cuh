// Long rows in shared memory (softmax_fwd_long, launched by launch_long in launch.cuh): forward
// rows of 16-byte chunks longer than the direct kernel holds (one CTA a row up to 32K fp16/bf16
// or 16K fp32 columns, clusters of 2..8 CTAs beyond, 128K columns at most).
//
// Each row is split into C contiguous blocks of G * K chunks, one per CTA of a thread-block cluster
// (C = 1 .. 8), and a CTA copies its block into shared memory (cp.async, K chunks a thread, each
// thread its own slots) and works from there in three passes: the max, the sum of the exponentials,
// and the write of e * (1 / sum). The row's values do not live in registers between passes, so a
// thread may own many chunks and a CTA has its whole block in flight at once; the grid is one
// cluster per row (not persistent), so that while one CTA reduces, the SM's other CTAs keep their
// copies in flight (32 or 64 KiB a CTA: 192 KiB of loads per SM). An explicit mask is read into
// registers once the copies have landed and applied in the first pass: fp16/bf16 write the masked
// columns back as -inf (the later passes need no mask), fp32 keep the thread's kept-column bits in
// one word. fp16/bf16 recompute the exponential in the write pass (ex2.approx: the same bits as in
// the sum); fp32 keep each e in place of its x from the second pass (its accurate expf costs more
// than a shared-memory round trip). On one CTA the arithmetic is forward_row's: the same max, e and
// 1 / sum (the sums in another order). A cluster's CTAs work from their own block's max m_r and sum
// s_r and swap the pairs once (Exchange): the row's max M and sum S = sum of s_r 2^(m_r - M) (base
// 2 with the scale folded in for fp16/bf16, which then recompute e with M; fp32 scale their stored
// e by exp(m_r - M) / S, in double). One swap a row is faster than the two cluster barriers a row
// it replaced (benchmarks/runs/).
#pragma once

#include <cstdint>

#include "chunks.cuh"
#include "common.cuh"
#include "reduce.cuh"

namespace te_fast_kernels {
namespace softmax_detail {

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

// Copies this thread's K chunks of a CTA's block (from column `base` of the row at src) into its
// slots of shared memory, and then reads their explicit mask bytes (from m) into `mask`.
template <typename T, int K, int G, bool kMask>
__device__ __forceinline__ void copy_block(const T* src, const bool* m,
                                           typename Chunk<T, kVec<T>>::R* xs, int t, int base,
                                           int limit, MaskChunk<kVec<T>, kMask>* mask) {
  constexpr int V = kVec<T>;
  using R = typename Chunk<T, V>::R;
  auto col = [&](int k) { return base + (k * G + t) * V; };
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
    if (col(k) < limit) mask[k].load(m + col(k));
  }
}

// fp16/bf16 on a cluster: the row's max M, its shift fl(M c), whether that shift is coarse
// (shift_coarse), and the row's sum from each CTA's pair (m_r, s_r): each CTA's sum of
// 2^(x c - m_r c) times 2^(m_r c - M c), in rank order (every CTA computes the same bits). A block
// with no kept column sends sum 0. Where fl(M c) is coarse, that factor is 1 for the blocks whose
// max is M, whose sums counted their columns equal to M, and 0 for the others; a block whose own
// m_r c is coarse (<= -2^24) in a row that is not has a finite sum and the factor 0.
struct ClusterRow {
  float mx;
  float shift;
  bool coarse;
  float sum;
};
template <int C>
__device__ __forceinline__ ClusterRow cluster_row_packed(const double2* pairs, float c) {
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
  return {row_mx, row_shift, row_coarse, total};
}

// fp32 on a cluster: this CTA's e are exp(x * scale - m_r), and y = e * exp(m_r - M) / S, with
// the row's max M and sum S = sum over ranks of s_r * exp(m_r - M) (double, in rank order). m_r
// is a CTA's shift, -inf where it keeps no column. The factor exp(m_r - M) / S of this rank.
template <int C>
__device__ __forceinline__ double cluster_factor_wide(const double2* pairs, int rank) {
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
  return total == 0.0 ? 0.0 : own / total;
}

// The three passes of fp16/bf16 over a block in shared memory: the max on packed words (an
// explicit mask's columns written back as -inf, so that the later passes need no mask), the sum
// of the exponentials, and the write of e * (1 / sum) with each e computed again (ex2.approx: the
// same bits as in the sum). n: the rows this CTA has done before this one (the exchange's turn).
template <typename T, int K, int G, int C, bool kMask, typename MaxSlots, typename SumSlots>
__device__ __forceinline__ void long_row_packed(const SoftmaxFwdArgs& a, int64_t row, int64_t n,
                                                int64_t stride, int rank, float c,
                                                typename Chunk<T, kVec<T>>::R* xs, int t,
                                                int base, int limit,
                                                const MaskChunk<kVec<T>, kMask>* mask, T* y,
                                                MaxSlots& max_slots, SumSlots& sum_slots,
                                                Exchange<C>& xchg) {
  constexpr int V = kVec<T>;
  using R = typename Chunk<T, V>::R;
  using P = Packed<T>;
  constexpr int kW = V / 2;
  auto col = [&](int k) { return base + (k * G + t) * V; };
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
    packed_words<T, V>(col(k), limit, [&] { return at(k); }, [] { return MaskChunk<V, false>{}; },
                       w);
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
    const ClusterRow r = cluster_row_packed<C>(pairs, c);
    // Blocks whose own max is coarse in a row that is not, and those that do not hold M in a row
    // that is coarse, write zeros: e from their own shift (finite), times 0.
    if (!own_coarse && !r.coarse) shift = r.shift;
    keep = own_coarse ? r.coarse && mx == r.mx : !r.coarse;
    sum = r.sum;
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
}

// The three passes of fp32 over a block in shared memory, with forward_row_general's arithmetic
// (the max of key * x over kept columns and the shift from it in double, wide_shift; the accurate
// expf of the double argument, double sums, TimesInv<double>): the max, the sum with each e
// stored in place of its x (the expf costs more than a shared-memory round trip), the write.
template <typename T, int K, int G, int C, bool kMask, typename MaxSlots, typename SumSlots>
__device__ __forceinline__ void long_row_wide(const SoftmaxFwdArgs& a, int64_t row, int64_t n,
                                              int64_t stride, int rank, float c,
                                              typename Chunk<T, kVec<T>>::R* xs, int t,
                                              int base, int limit,
                                              const MaskChunk<kVec<T>, kMask>* mask, T* y,
                                              MaxSlots& max_slots, SumSlots& sum_slots,
                                              Exchange<C>& xchg) {
  constexpr int V = kVec<T>;
  using R = typename Chunk<T, V>::R;
  static_assert(K * V <= 32, "the kept-column bits of a thread are one 32-bit word");
  auto col = [&](int k) { return base + (k * G + t) * V; };
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
    const double2* pairs = xchg.swap(n, rank, mx == -INFINITY ? -INFINITY : shift, sum);
    inv = cluster_factor_wide<C>(pairs, rank);
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
    MaskChunk<V, kMask> mask[K];
    copy_block<T, K, G>(src, p.m, xs, t, base, limit, mask);
    T* y = static_cast<T*>(a.y) + row * a.sk;
    if constexpr (!kWide<T>) {
      long_row_packed<T, K, G, C, kMask>(a, row, n, stride, rank, c, xs, t, base, limit, mask, y,
                                         max_slots, sum_slots, xchg);
    } else {
      long_row_wide<T, K, G, C, kMask>(a, row, n, stride, rank, c, xs, t, base, limit, mask, y,
                                       max_slots, sum_slots, xchg);
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

}  // namespace softmax_detail
}  // namespace te_fast_kernels
