// te-conformance stand-in for TE's transformer_engine/common/util/logging.h.
//
// TE's header includes cublas_v2.h, cudnn.h, nvrtc.h and nccl.h for its NVTE_CHECK_CUBLAS /
// _CUDNN / _NVRTC / _NCCL macros; the fused softmax kernels and the tensor code they link with
// use none of those, and the toolkit on a CPU build box has none of those headers. This file
// keeps the macros that they use (NVTE_WARN, NVTE_ERROR, NVTE_CHECK, NVTE_CHECK_CUDA) with TE's
// behaviour: a std::runtime_error whose text names file, line and function.
#ifndef TRANSFORMER_ENGINE_COMMON_UTIL_LOGGING_H_
#define TRANSFORMER_ENGINE_COMMON_UTIL_LOGGING_H_

#include <cuda_runtime_api.h>
#include <library_types.h>  // cudaDataType_t for common.h (TE's header gets it via cublas_v2.h)

#include <iostream>
#include <stdexcept>
#include <string>

#include "../util/string.h"

#define NVTE_WARN(...)                                            \
  do {                                                            \
    std::cerr << ::transformer_engine::concat_strings(            \
        __FILE__ ":", __LINE__, " in function ", __func__, ": ",  \
        ::transformer_engine::concat_strings(__VA_ARGS__), "\n"); \
  } while (false)

#define NVTE_ERROR(...)                                              \
  do {                                                               \
    throw ::std::runtime_error(::transformer_engine::concat_strings( \
        __FILE__ ":", __LINE__, " in function ", __func__, ": ",     \
        ::transformer_engine::concat_strings(__VA_ARGS__)));         \
  } while (false)

#define NVTE_CHECK(expr, ...)                                        \
  do {                                                               \
    if (!(expr)) {                                                   \
      NVTE_ERROR("Assertion failed: " #expr ". ",                    \
                 ::transformer_engine::concat_strings(__VA_ARGS__)); \
    }                                                                \
  } while (false)

#define NVTE_CHECK_CUDA(expr)                                           \
  do {                                                                  \
    const cudaError_t status_NVTE_CHECK_CUDA = (expr);                  \
    if (status_NVTE_CHECK_CUDA != cudaSuccess) {                        \
      NVTE_ERROR("CUDA Error: ", cudaGetErrorString(status_NVTE_CHECK_CUDA)); \
    }                                                                   \
  } while (false)

#endif  // TRANSFORMER_ENGINE_COMMON_UTIL_LOGGING_H_
