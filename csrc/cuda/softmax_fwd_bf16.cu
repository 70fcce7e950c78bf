// The fwd softmax kernels for bf16 data (see softmax_impl.cuh).
#include "softmax_impl.cuh"

namespace te_fast_kernels {
namespace softmax_detail {
template cudaError_t softmax_fwd_typed<__nv_bfloat16>(const SoftmaxFwdArgs&, cudaStream_t);
}  // namespace softmax_detail
}  // namespace te_fast_kernels
