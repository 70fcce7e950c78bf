// The softmax entry points of kernels.h: a switch over the dtype. The kernels are in
// softmax_impl.cuh and are compiled one dtype and direction per file (softmax_<dir>_<dtype>.cu),
// so that a parallel build compiles them side by side.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.h"

namespace te_fast_kernels {
namespace softmax_detail {

template <typename T>
cudaError_t softmax_fwd_typed(const SoftmaxFwdArgs& a, cudaStream_t stream);
template <typename T>
cudaError_t softmax_bwd_typed(const SoftmaxBwdArgs& a, cudaStream_t stream);

extern template cudaError_t softmax_fwd_typed<float>(const SoftmaxFwdArgs&, cudaStream_t);
extern template cudaError_t softmax_fwd_typed<__half>(const SoftmaxFwdArgs&, cudaStream_t);
extern template cudaError_t softmax_fwd_typed<__nv_bfloat16>(const SoftmaxFwdArgs&, cudaStream_t);
extern template cudaError_t softmax_bwd_typed<float>(const SoftmaxBwdArgs&, cudaStream_t);
extern template cudaError_t softmax_bwd_typed<__half>(const SoftmaxBwdArgs&, cudaStream_t);
extern template cudaError_t softmax_bwd_typed<__nv_bfloat16>(const SoftmaxBwdArgs&, cudaStream_t);

}  // namespace softmax_detail

cudaError_t launch_softmax_fwd(DType dtype, const SoftmaxFwdArgs& args, cudaStream_t stream) {
  using namespace softmax_detail;
  if (args.rows == 0 || args.sk == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32: return softmax_fwd_typed<float>(args, stream);
    case DType::kFloat16: return softmax_fwd_typed<__half>(args, stream);
    case DType::kBFloat16: return softmax_fwd_typed<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_softmax_bwd(DType dtype, const SoftmaxBwdArgs& args, cudaStream_t stream) {
  using namespace softmax_detail;
  if (args.rows == 0 || args.sk == 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32: return softmax_bwd_typed<float>(args, stream);
    case DType::kFloat16: return softmax_bwd_typed<__half>(args, stream);
    case DType::kBFloat16: return softmax_bwd_typed<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace te_fast_kernels
