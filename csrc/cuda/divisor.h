// n / d by a multiply and a shift (Granlund and Montgomery; the form of PyTorch's IntDivider):
// floor(n / d) = (mulhi(n, magic) + n) >> shift, in 32 bits for n, d < 2^31 and in 64 bits
// (magic64) for n, d < 2^63. On the GPU a division by a run-time value takes ~20 instructions,
// several of them on the conversion and MUFU pipes that a forward row's exponentials need, and a
// 64-bit one is a subroutine call, whose saved registers spill. Pure C++ with CUDA intrinsics on
// the device: suites/te_fast/test_divisor.py checks the host build of the same functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TE_DIV_HD __host__ __device__ __forceinline__
#else
#define TE_DIV_HD inline
#endif

namespace te_fast_kernels {

constexpr int64_t kMaxDivisor32 = 0x7fffffff;  // dividends and divisors of the 32-bit form

struct Divisor {
  uint32_t magic = 0;  // 0 when d > kMaxDivisor32 (the 32-bit form does not apply)
  uint32_t shift = 0;
  uint64_t magic64 = 0;
};

TE_DIV_HD uint32_t mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

TE_DIV_HD uint64_t mulhi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// floor(n / d) for n <= kMaxDivisor32 and the Divisor of a d <= kMaxDivisor32.
TE_DIV_HD uint32_t divide(uint32_t n, const Divisor& d) {
  return (mulhi(n, d.magic) + n) >> d.shift;
}

// floor(n / d) for n < 2^63.
TE_DIV_HD uint64_t divide(uint64_t n, const Divisor& d) {
  return (mulhi(n, d.magic64) + n) >> d.shift;
}

// The Divisor of d (1 <= d < 2^63): shift = ceil(log2 d), magic = 2^N (2^shift - d) / d + 1 for
// N = 32 (d <= kMaxDivisor32) and 64. (Host only.)
inline Divisor make_divisor(int64_t d) {
  uint32_t shift = 0;
  while ((uint64_t{1} << shift) < static_cast<uint64_t>(d)) ++shift;  // up to 63
  using U128 = unsigned __int128;
  const U128 excess = (U128{1} << shift) - static_cast<U128>(d);
  Divisor out;
  out.shift = shift;
  out.magic64 = static_cast<uint64_t>((excess << 64) / static_cast<U128>(d) + 1);
  if (d <= kMaxDivisor32) {
    out.magic = static_cast<uint32_t>((excess << 32) / static_cast<U128>(d) + 1);
  }
  return out;
}

}  // namespace te_fast_kernels
