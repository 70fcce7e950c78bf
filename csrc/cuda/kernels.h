// Launch helpers of the pure-CUDA kernels: raw pointers and a cudaStream_t, no torch headers,
// so CI can compile-check the .cu files with plain nvcc. The torch glue lives in te_fast_cuda.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "divisor.h"

namespace te_fast_kernels {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct SoftmaxFwdArgs {
  const void* x;
  const bool* mask;           // only for te_fast_rules::kExplicitMask
  int64_t mask_batch_stride;  // 0 for a broadcast [1, 1, sq, sk] mask, else sq * sk
  void* y;
  int64_t rows;
  int64_t sq;
  int64_t sk;
  int64_t heads;
  double scale;  // the op's own: fp32 data use it as is, fp16/bf16 its fp32 rounding
  int mode;  // te_fast_rules::MaskMode
  // Set by the launcher (not the caller): row / sq and row / (heads * sq).
  Divisor by_sq;
  Divisor by_head_rows;
};

struct SoftmaxBwdArgs {
  const void* dy;
  const void* y;
  void* dx;
  int64_t rows;
  int64_t sq;
  int64_t sk;
  double scale;  // the op's own: fp32 data use it as is, fp16/bf16 its fp32 rounding
  int mode;  // te_fast_rules::MaskMode: a causal mode reads dy and y only where kept, writes +0
             // past a row's kept prefix; kNoMask, the whole row
  // Set by the launcher (not the caller), causal modes only: row / sq.
  Divisor by_sq;
};

// Byte-level token-row copies between [t, h, d] and [b, s, h, d]; any element size.
struct ConvertArgs {
  const void* src;
  void* dst;
  const int32_t* cu_seqlens;  // [batch + 1], on the device
  int64_t batch;
  int64_t seqlen;     // s of the bshd side
  int64_t tokens;     // t of the thd side
  int64_t row_bytes;  // bytes of one token row
  int elem_size;
  uint64_t nan_bits;  // the element dtype's NaN, written into sequences with bad cu_seqlens
};

cudaError_t launch_softmax_fwd(DType dtype, const SoftmaxFwdArgs& args, cudaStream_t stream);
cudaError_t launch_softmax_bwd(DType dtype, const SoftmaxBwdArgs& args, cudaStream_t stream);
cudaError_t launch_thd_to_bshd(const ConvertArgs& args, cudaStream_t stream);
cudaError_t launch_bshd_to_thd(const ConvertArgs& args, cudaStream_t stream);

}  // namespace te_fast_kernels
