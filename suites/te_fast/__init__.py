"""te_fast's own tests: its ops, op contracts, eager core, dispatch paths, large sizes, the row
divisor, second-order gradients and FP8 API; and TE's fused softmax kernels run through the same op
cases (an op adapter). They judge no module adapter."""
