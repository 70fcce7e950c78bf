"""UnfusedDotProductAttention's forward and backward over every layout family, mask type, GQA,
sink softmax, bias, window, dropout and the FP8 island, for compute-sanitizer; called by
tools/sanitize/ops.py --module (one process per tool), or on its own:

    PYTHONPATH=. PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \\
        --error-exitcode 1 python3 tools/sanitize/module.py
    PYTHONPATH=. python3 tools/sanitize/module.py --device cpu      # dry run, no GPU
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import te_fast  # noqa: E402
from te_conformance.suites.cases import AttnCase, make_inputs  # noqa: E402
from te_ref.layouts import ATTN_MASK_TYPES, LAYOUTS, parse_layout  # noqa: E402

SMALL = dict(b=2, sq=9, skv=9, h=4, hg=4, d=16, dv=16)


# the padding type a thd layout takes in place of each other type
THD_MASK = {
    "no_mask": "padding",
    "causal": "padding_causal",
    "causal_bottom_right": "padding_causal_bottom_right",
    "arbitrary": "padding_causal",
}


def cases(reduced: bool) -> list[tuple[AttnCase, float, str | None]]:
    """(case, dropout, fp8 recipe name or None): every layout, each with mask types in turn
    (so that every family sees every mask type), then GQA/MQA, MLA, cross attention, sink
    softmax, biases, windows, max_logit, ragged batches, a longer kv cache, dropout, FP8."""
    out = []
    layouts = sorted(LAYOUTS)
    masks = list(ATTN_MASK_TYPES)
    for i, layout in enumerate(layouts):
        thd = parse_layout(layout).q_format == "thd"
        for j in range(1 if reduced else 3):
            mask = masks[(i + j * 3) % len(masks)]
            if thd:  # a thd q takes the padding types only (SPEC §1)
                mask = THD_MASK.get(mask, mask)
            extra = 3 if thd and parse_layout(layout).kv_format != "thd" else 0
            varlen = ("zero_length", "trailing", "random")[j % 3] if thd else "random"
            out.append((AttnCase(layout, "bf16", mask, kv_cache_extra=extra, varlen=varlen,
                                 **SMALL), 0.0, None))  # fmt: skip
        if reduced and i % 5:
            out.pop()  # racecheck: one layout of each family of five
    more = [
        AttnCase("bshd_bshd_bshd", "bf16", "causal", **dict(SMALL, hg=2)),  # GQA
        AttnCase("sbhd_sbhd_sbhd", "fp16", "padding", **dict(SMALL, hg=1)),  # MQA
        AttnCase("thd_thd_thd", "bf16", "padding_causal", **dict(SMALL, hg=2)),  # GQA, thd
        AttnCase("bshd_bshd_bshd", "bf16", "no_mask", **dict(SMALL, dv=8)),  # MLA
        AttnCase("sbhd_sbhd_sbhd", "bf16", "causal_bottom_right", **dict(SMALL, skv=13)),
        AttnCase("bshd_bshd_bshd", "bf16", "padding", padding_from="mask", **dict(SMALL, skv=13)),
        AttnCase("bs3hd", "bf16", "causal", softmax_type="off-by-one", **SMALL),
        AttnCase("thd_thd_thd", "bf16", "padding", softmax_type="learnable", **SMALL),
        AttnCase("sbh3d", "fp32", "no_mask", softmax_type="learnable", offset_via="param",
                 return_max_logit=True, **SMALL),
        AttnCase("bshd_bshd_bshd", "bf16", "arbitrary", bias_type="post_scale_bias",
                 bias_shape="1hss", window=(3, 2), **SMALL),
        AttnCase("sbhd_sbhd_sbhd", "bf16", "causal", bias_type="pre_scale_bias",
                 bias_shape="111s", **SMALL),
        AttnCase("bshd_bshd_bshd", "bf16", "no_mask", bias_type="alibi", **SMALL),
        AttnCase("thd_bshd_bshd", "bf16", "padding_causal_bottom_right", bias_type="alibi",
                 alibi_slopes="bh", kv_cache_extra=5, **SMALL),
        AttnCase("bshd_bshd_bshd", "fp16", "padding_causal", window=(2, 0),
                 bottom_right_diagonal=True, **SMALL),
        AttnCase("thd_thd_thd", "bf16", "padding_causal_bottom_right", varlen="full", **SMALL),
    ]  # fmt: skip
    out += [(c, 0.0, None) for c in (more[::4] if reduced else more)]
    out.append((AttnCase("bshd_bshd_bshd", "bf16", "causal", **SMALL), 0.2, None))  # dropout
    out.append((AttnCase("thd_thd_thd", "bf16", "padding", **SMALL), 0.2, None))
    for recipe in ("delayed",) if reduced else ("delayed", "current", "output"):
        out.append((AttnCase("sbh3d", "bf16", "causal", **SMALL), 0.0, recipe))
    if not reduced:
        out.append((AttnCase("thd_thd_thd", "fp16", "padding_causal", **SMALL), 0.0, "current"))
    return out


def _fp8_kwargs(recipe: str) -> dict:
    from te_fast.fp8 import CurrentScaling, DelayedScaling

    chosen = CurrentScaling() if recipe == "current" else DelayedScaling()
    return {"fp8": True, "fp8_meta": {"recipe": chosen}, "fp8_output": recipe == "output"}


def run_case(case: AttnCase, dev: torch.device, dropout: float, recipe: str | None) -> None:
    """One forward and backward of the module on the case's inputs."""
    case = replace(case, device=dev.type)
    if dev.type == "cpu" and case.dtype == "fp16":
        case = replace(case, dtype="bf16")
    inputs = make_inputs(case, dev, torch.Generator().manual_seed(0))
    module = te_fast.UnfusedDotProductAttention(
        case.d**-0.5, attention_type=case.attention_type, attention_dropout=dropout,
        softmax_type=case.softmax_type, return_max_logit=case.return_max_logit,
        num_attention_heads=case.h if case.offset_via == "param" else None,
    ).to(dev).train()  # fmt: skip
    leaves = {n: t.clone().requires_grad_() for n, t in inputs.leaves.items()}
    q, k, v, extra = inputs.views(leaves, case)
    kwargs = {**inputs.kwargs, **extra}
    if case.offset_via == "param":
        with torch.no_grad():
            module.softmax_offset.copy_(kwargs.pop("softmax_offset"))
    if recipe is not None:
        kwargs.update(_fp8_kwargs(recipe))
    result = module(q, k, v, **kwargs)
    out = result[0] if case.return_max_logit else result
    if recipe == "output":
        out = out.float()  # a Float8Tensor: ordinary ops see its dequantized values
    targets = [t for n, t in leaves.items() if not (n == "offset" and case.offset_via == "param")]
    if case.offset_via == "param":
        targets.append(module.softmax_offset)
    torch.autograd.grad(out, targets, inputs.grad_out.to(out.dtype))


def run(dev: torch.device, reduced: bool = False) -> int:
    """Every case of the list; returns how many forward+backward calls were made."""
    n = 0
    for case, dropout, recipe in cases(reduced):
        try:
            run_case(case, dev, dropout, recipe)
        except Exception as e:
            raise RuntimeError(f"sanitize_module: {case.id} dropout={dropout} fp8={recipe}") from e
        n += 1
    return n


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--reduced", action="store_true", help="the short list (racecheck)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("sanitize_module: no CUDA device", file=sys.stderr)
        return 2
    start = time.time()
    dev = torch.device(args.device)
    n = run(dev, args.reduced)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    print(f"sanitize_module: done: {n} module calls on {dev.type} in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
