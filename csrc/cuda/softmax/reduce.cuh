// Reductions over the threads of a row: lane -> warp shuffle -> shared memory across the warps of
// a CTA -> distributed shared memory across the CTAs of a thread-block cluster (row_reduce), the
// split cluster barrier, and the once-a-row exchange of (max, sum) pairs between the CTAs of a
// cluster (Exchange), which takes the place of cluster-wide barriers.
#pragma once

#include <cooperative_groups.h>

#include "common.cuh"

namespace te_fast_kernels {
namespace softmax_detail {

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

}  // namespace softmax_detail
}  // namespace te_fast_kernels
