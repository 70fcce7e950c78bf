// The bwd softmax kernels for fp32 data (see softmax_impl.cuh).
#include "softmax_impl.cuh"

namespace te_fast_kernels {
namespace softmax_detail {
template cudaError_t softmax_bwd_typed<float>(const SoftmaxBwdArgs&, cudaStream_t);
}  // namespace softmax_detail
}  // namespace te_fast_kernels
