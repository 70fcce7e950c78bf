// te-conformance's C binding of Transformer Engine's fused softmax kernels (no torch headers).
//
// Each function does what TE's transformer_engine/pytorch/csrc/extensions/softmax.cpp does after
// its shape checks (which suites/te_kernels.py repeats in Python, with TE's messages): wrap the
// raw device pointers in transformer_engine::TensorWrapper (softmax.cpp's
// makeTransformerEngineTensor) and call the nvte_* function on the caller's stream. The caller
// allocates every output, contiguous. Returns 0, or 1 with the exception's text in
// te_kernels_last_error(). Loaded with ctypes; dtype 0 = fp16, 1 = bf16.
#include <cuda_runtime_api.h>
#include <transformer_engine/softmax.h>
#include <transformer_engine/transformer_engine.h>

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#ifndef TE_KERNELS_TE_COMMIT
#define TE_KERNELS_TE_COMMIT "unknown"
#endif

namespace {

using transformer_engine::DType;
using transformer_engine::TensorWrapper;

thread_local std::string last_error;

std::vector<size_t> dims(const int64_t *shape, int ndim) {
  return std::vector<size_t>(shape, shape + ndim);
}

DType data_type(int dtype) { return dtype == 1 ? DType::kBFloat16 : DType::kFloat16; }

TensorWrapper wrap(const void *ptr, const int64_t *shape, int ndim, DType dtype) {
  return TensorWrapper(const_cast<void *>(ptr), dims(shape, ndim), dtype);
}

template <typename F>
int guarded(F &&f) {
  try {
    f();
    return 0;
  } catch (const std::exception &e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return 1;
}

}  // namespace

extern "C" {

const char *te_kernels_last_error() { return last_error.c_str(); }

const char *te_kernels_te_commit() { return TE_KERNELS_TE_COMMIT; }

// input, softmax_results: [b, h, sq, sk]
int te_kernels_scaled_softmax_forward(const void *input, void *softmax_results,
                                      const int64_t *shape, int dtype, float scale,
                                      cudaStream_t stream) {
  return guarded([&] {
    auto input_cu = wrap(input, shape, 4, data_type(dtype));
    auto results_cu = wrap(softmax_results, shape, 4, data_type(dtype));
    nvte_scaled_softmax_forward(input_cu.data(), results_cu.data(), scale, stream);
  });
}

// output_grads (dy), softmax_results (y), input_grads (dx): [b, h, sq, sk]
int te_kernels_scaled_softmax_backward(const void *output_grads, const void *softmax_results,
                                       void *input_grads, const int64_t *shape, int dtype,
                                       float scale, cudaStream_t stream) {
  return guarded([&] {
    auto dy = wrap(output_grads, shape, 4, data_type(dtype));
    auto y = wrap(softmax_results, shape, 4, data_type(dtype));
    auto dx = wrap(input_grads, shape, 4, data_type(dtype));
    nvte_scaled_softmax_backward(dy.data(), y.data(), dx.data(), scale, stream);
  });
}

// input, softmax_results: [b, h, sq, sk]; mask: [1|b, 1, sq, sk], one byte per element
// (a torch bool tensor: 1 = masked out)
int te_kernels_scaled_masked_softmax_forward(const void *input, const void *mask,
                                             void *softmax_results, const int64_t *shape,
                                             const int64_t *mask_shape, int dtype, float scale,
                                             cudaStream_t stream) {
  return guarded([&] {
    auto input_cu = wrap(input, shape, 4, data_type(dtype));
    auto mask_cu = wrap(mask, mask_shape, 4, DType::kByte);
    auto results_cu = wrap(softmax_results, shape, 4, data_type(dtype));
    nvte_scaled_masked_softmax_forward(input_cu.data(), mask_cu.data(), results_cu.data(), scale,
                                       stream);
  });
}

// softmax.cpp's scaled_masked_softmax_backward calls nvte_scaled_softmax_backward (both nvte
// backwards run the same dispatcher); this does the same.
int te_kernels_scaled_masked_softmax_backward(const void *output_grads,
                                              const void *softmax_results, void *input_grads,
                                              const int64_t *shape, int dtype, float scale,
                                              cudaStream_t stream) {
  return te_kernels_scaled_softmax_backward(output_grads, softmax_results, input_grads, shape,
                                            dtype, scale, stream);
}

// input, softmax_results: [attn_batches, sq, sk]
int te_kernels_scaled_upper_triang_masked_softmax_forward(const void *input,
                                                          void *softmax_results,
                                                          const int64_t *shape, int dtype,
                                                          float scale, cudaStream_t stream) {
  return guarded([&] {
    auto input_cu = wrap(input, shape, 3, data_type(dtype));
    auto results_cu = wrap(softmax_results, shape, 3, data_type(dtype));
    nvte_scaled_upper_triang_masked_softmax_forward(input_cu.data(), results_cu.data(), scale,
                                                    stream);
  });
}

int te_kernels_scaled_upper_triang_masked_softmax_backward(const void *output_grads,
                                                           const void *softmax_results,
                                                           void *input_grads, const int64_t *shape,
                                                           int dtype, float scale,
                                                           cudaStream_t stream) {
  return guarded([&] {
    auto dy = wrap(output_grads, shape, 3, data_type(dtype));
    auto y = wrap(softmax_results, shape, 3, data_type(dtype));
    auto dx = wrap(input_grads, shape, 3, data_type(dtype));
    nvte_scaled_upper_triang_masked_softmax_backward(dy.data(), y.data(), dx.data(), scale,
                                                     stream);
  });
}

// input, softmax_results: [b, h, sq, sk]
int te_kernels_scaled_aligned_causal_masked_softmax_forward(const void *input,
                                                            void *softmax_results,
                                                            const int64_t *shape, int dtype,
                                                            float scale, cudaStream_t stream) {
  return guarded([&] {
    auto input_cu = wrap(input, shape, 4, data_type(dtype));
    auto results_cu = wrap(softmax_results, shape, 4, data_type(dtype));
    nvte_scaled_aligned_causal_masked_softmax_forward(input_cu.data(), results_cu.data(), scale,
                                                      stream);
  });
}

int te_kernels_scaled_aligned_causal_masked_softmax_backward(const void *output_grads,
                                                             const void *softmax_results,
                                                             void *input_grads,
                                                             const int64_t *shape, int dtype,
                                                             float scale, cudaStream_t stream) {
  return guarded([&] {
    auto dy = wrap(output_grads, shape, 4, data_type(dtype));
    auto y = wrap(softmax_results, shape, 4, data_type(dtype));
    auto dx = wrap(input_grads, shape, 4, data_type(dtype));
    nvte_scaled_aligned_causal_masked_softmax_backward(dy.data(), y.data(), dx.data(), scale,
                                                       stream);
  });
}

}  // extern "C"
