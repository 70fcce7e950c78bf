// te-conformance stand-in for TE's transformer_engine/common/util/rtc.h (NVRTC kernel manager).
//
// Since TE's "Migrate norms and softmax kernels to NVRTC" (#3156) the fused softmax dispatchers
// compile their kernels at run time through rtc::KernelManager when rtc::is_enabled(), and launch
// the ahead-of-time instantiations when it is not and NVTE_BUILD_LEGACY_STATIC_FUSED_SOFTMAX is
// 1 (TE's own build switch). This build takes the ahead-of-time path only: is_enabled() is false,
// so the kernels timed and judged are compiled once, by nvcc, from TE's unmodified source. The
// manager's members exist so that the dispatchers compile; reaching one is an error.
#ifndef TRANSFORMER_ENGINE_COMMON_UTIL_RTC_H_
#define TRANSFORMER_ENGINE_COMMON_UTIL_RTC_H_

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "../util/logging.h"

namespace transformer_engine {
namespace rtc {

inline bool is_enabled() { return false; }

struct Header {
  const char *content;
  const char *include_name;
};

class KernelManager {
 public:
  static KernelManager &instance() {
    static KernelManager manager;
    return manager;
  }
  void compile(const std::string &, const std::string &, const std::string &, const std::string &,
               const std::vector<std::string> & = {}, const std::vector<Header> & = {}) {
    NVTE_ERROR("te-conformance build: NVRTC is not built in (ahead-of-time kernels only)");
  }
  bool is_compiled(const std::string &, int = -1) const { return false; }
  template <typename... ArgTs>
  void launch(const std::string &, const dim3, const dim3, unsigned int, cudaStream_t,
              ArgTs &&...) {
    NVTE_ERROR("te-conformance build: NVRTC is not built in (ahead-of-time kernels only)");
  }
};

}  // namespace rtc
}  // namespace transformer_engine

#endif  // TRANSFORMER_ENGINE_COMMON_UTIL_RTC_H_
