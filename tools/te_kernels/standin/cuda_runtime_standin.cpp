// te-conformance stand-in for three functions of TE's transformer_engine/common/util/cuda_runtime.cpp.
//
// TE's file also locates the CUDA include directory for NVRTC and loads cuBLASLt (it includes
// cublasLt.h and a generated string_path_cuda_include.h); the kernels built here need only the
// device queries below, which transformer_engine.cpp, common.cu and cuda_driver.cpp call.
// Same results as TE's: the current device (0 before any CUDA context exists), the device count,
// and 10 * major + minor.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "common/util/cuda_runtime.h"
#include "common/util/logging.h"

namespace transformer_engine {
namespace cuda {

int num_devices() {
  static const int count = [] {
    int n = 0;
    NVTE_CHECK_CUDA(cudaGetDeviceCount(&n));
    return n;
  }();
  return count;
}

int current_device() {
  // TE asks the driver (cuCtxGetCurrent) whether a context exists first; cudaGetDevice would
  // return device 0 without one as well, and creates none.
  int device_id = 0;
  NVTE_CHECK_CUDA(cudaGetDevice(&device_id));
  return device_id;
}

int sm_arch(int device_id) {
  static std::vector<int> cache(num_devices(), -1);
  static std::vector<std::once_flag> flags(num_devices());
  if (device_id < 0) device_id = current_device();
  NVTE_CHECK(0 <= device_id && device_id < num_devices(), "invalid CUDA device ID");
  std::call_once(flags[device_id], [&] {
    cudaDeviceProp prop;
    NVTE_CHECK_CUDA(cudaGetDeviceProperties(&prop, device_id));
    cache[device_id] = 10 * prop.major + prop.minor;
  });
  return cache[device_id];
}

}  // namespace cuda
}  // namespace transformer_engine
