"""Drive one softmax kernel a few times for `ncu` (profile the last launch).

    ncu --kernel-name regex:softmax --launch-skip 3 --launch-count 1 \
        python tools/ncu_softmax.py --op fwd --dtype bf16 --sk 2048

--impl te_fast (default) | triton (the benchmark's Triton peer) | torch (torch.softmax).
About 64M elements per call (--numel), the benchmark's shape [rows / 64, 1, 64, sk] otherwise.
"""

from __future__ import annotations

import argparse

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--op", choices=("fwd", "masked", "causal", "bwd"), default="fwd")
    p.add_argument("--impl", choices=("te_fast", "triton", "torch"), default="te_fast")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--sk", type=int, default=2048)
    p.add_argument("--numel", type=int, default=64 << 20)
    p.add_argument("--calls", type=int, default=4)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("ncu_softmax.py: needs a CUDA device")
    sq = 64
    rows = max(a.numel // a.sk, sq)
    b = rows // sq
    x = torch.randn(b, 1, sq, a.sk, device="cuda", dtype=DTYPES[a.dtype])
    scale = 0.125
    if a.impl == "triton":
        from benchmarks.triton_softmax import softmax as triton_softmax

        run = lambda: triton_softmax(x, scale)
    elif a.impl == "torch":
        run = lambda: torch.softmax(x, -1)
    else:
        import te_fast

        ops = te_fast.ops
        if a.op == "fwd":
            run = lambda: ops.scaled_softmax(x, scale)
        elif a.op == "masked":
            mask = torch.rand(b, 1, sq, a.sk, device="cuda") < 0.25
            run = lambda: ops.scaled_masked_softmax(x, mask, scale)
        elif a.op == "causal":
            x3 = x.view(b, sq, a.sk) if a.sk == sq else x[:, 0, :, :sq].contiguous()
            run = lambda: ops.scaled_upper_triang_masked_softmax(x3, scale)
        else:
            y = ops.scaled_softmax(x, scale)
            dy = torch.randn_like(y)
            run = lambda: ops.scaled_softmax_bwd(dy, y, scale)
    for _ in range(a.calls):
        run()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
