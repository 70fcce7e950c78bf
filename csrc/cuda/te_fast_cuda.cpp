// CUDA backend of the te_fast ops: torch glue around the pure-CUDA launchers in kernels.h.
// Every launch runs on the current stream of the input's device (under a device guard), which is
// what CUDA-graph capture and torch.compile(mode="reduce-overhead") rely on.
// (c10::cuda::getCurrentCUDAStream is what at::cuda::getCurrentCUDAStream names; its header
// does not pull in cuBLAS/cuSPARSE, which keeps this file quick to build and to syntax-check.)
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>

#include "checks.h"
#include "cuda/kernels.h"
#include "op_table.h"

namespace te_fast {
namespace {

namespace k = te_fast_kernels;

k::DType kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return k::DType::kFloat16;
    case at::kBFloat16: return k::DType::kBFloat16;
    default: return k::DType::kFloat32;  // the shared checks admit only these three
  }
}

uint64_t nan_bits(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return 0x7ff8000000000000ull;
    case at::kFloat: return 0x7fc00000ull;
    case at::kHalf: return 0x7e00ull;
    case at::kBFloat16: return 0x7fc0ull;
    case at::kFloat8_e4m3fn: return 0x7full;
    case at::kFloat8_e5m2: return 0x7eull;
    default: return 0;
  }
}

// Host-side validation of cu_seqlens costs a device-to-host copy, so it runs only when
// TE_FAST_DEBUG_CHECKS=1; otherwise the kernels' NaN poisoning is the (sync-free) signal.
void debug_validate(const ConvertPlan& p) {
  if (!debug_checks_enabled()) return;
  const at::Tensor host = p.cu.cpu();
  validate_cu_seqlens(p, host.const_data_ptr<int32_t>());
}

k::ConvertArgs convert_args(const at::Tensor& src, const at::Tensor& cu,
                            const at::Tensor& out, const ConvertShape& s) {
  return {src.const_data_ptr(), out.mutable_data_ptr(), cu.const_data_ptr<int32_t>(),
          s.batch,          s.seqlen,                s.tokens,
          s.row_bytes,      static_cast<int>(src.element_size()), nan_bits(src.scalar_type())};
}

struct CudaBackend {
  static void softmax_fwd(const SoftmaxFwdPlan& p, double scale, int mode) {
    const c10::cuda::CUDAGuard guard(p.x.device());
    const k::SoftmaxFwdArgs a{p.x.const_data_ptr(),
                              p.mask.defined() ? p.mask.const_data_ptr<bool>() : nullptr,
                              p.mask_batch_stride,
                              p.y.mutable_data_ptr(),
                              p.g.rows,
                              p.g.sq,
                              p.g.sk,
                              p.g.heads,
                              scale,
                              mode};
    C10_CUDA_CHECK(k::launch_softmax_fwd(kernel_dtype(p.x.scalar_type()), a,
                                         c10::cuda::getCurrentCUDAStream()));
  }

  static void softmax_bwd(const SoftmaxBwdPlan& p, double scale, int mode) {
    const c10::cuda::CUDAGuard guard(p.y.device());
    const k::SoftmaxBwdArgs a{p.dy.const_data_ptr(),
                              p.y.const_data_ptr(),
                              p.dx.mutable_data_ptr(),
                              p.g.rows,
                              p.g.sq,
                              p.g.sk,
                              scale,
                              mode};
    C10_CUDA_CHECK(k::launch_softmax_bwd(kernel_dtype(p.y.scalar_type()), a,
                                         c10::cuda::getCurrentCUDAStream()));
  }

  static void convert(const ConvertPlan& p) {
    const c10::cuda::CUDAGuard guard(p.src.device());
    debug_validate(p);
    const k::ConvertArgs a = convert_args(p.src, p.cu, p.out, p.s);
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    C10_CUDA_CHECK(p.to_bshd ? k::launch_thd_to_bshd(a, stream)
                             : k::launch_bshd_to_thd(a, stream));
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(te_fast, CUDA, m) { OpTable<CudaBackend>::register_all(m); }

}  // namespace te_fast
