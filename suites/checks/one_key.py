"""One kept key, exactly: a query row that keeps exactly one key puts probability exactly 1.0 on
it, so its output is that key's value row bit for bit (P @ V with a one-hot P rounds nothing),
for each mask type that can leave one key (causal row 0, bottom-right row sq - skv, an
arbitrary mask, a kv length of 1), with GQA. Exact by construction in te_fast on every device
(its softmax kernels form exp(0) = 1 over a sum of 1) and in torch's CPU kernels; a fused CUDA
kernel with an online softmax may form the exponent as exp2(fma(s, scale * log2 e, -max)), the
product's rounding error where 0 belongs, so an adapter declares where it promises it (the
``exact_one_key`` capability). Used by suites/conformance/test_attention.py (every adapter)
and suites/te_fast/test_dispatch_paths.py (te_fast's ops path and eager core)."""

from __future__ import annotations

import torch

from te_conformance.suites.cases import DTYPES, AttnCase
from te_conformance.suites.checks.numerics import assert_bitwise_equal

# variant -> (attn_mask_type, sq, skv, kv lengths or None): the query rows with exactly one kept
# key are row 0 (top-left causal, sq = skv), row sq - skv (bottom-right, sq > skv; the rows above
# it keep nothing), every row (an arbitrary mask keeping one random key per batch, head and row)
# and every row of batch element 0 (padding, kv length 1).
ONE_KEY = {
    "causal": ("causal", 7, 7, None),
    "causal_bottom_right": ("causal_bottom_right", 9, 5, None),
    "arbitrary": ("arbitrary", 7, 11, None),
    "padding": ("padding", 7, 11, (1, 11)),
}


ONE_KEY_H, ONE_KEY_HG, ONE_KEY_D = 4, 2, 8


def one_key_case(variant: str, dtype_name: str, device_name: str) -> AttnCase:
    """The bshd case of a variant (its mask type and sizes, GQA)."""
    mask_type, sq, skv, _ = ONE_KEY[variant]
    return AttnCase("bshd_bshd_bshd", dtype_name, mask_type, device=device_name, b=2, sq=sq,
                    skv=skv, h=ONE_KEY_H, hg=ONE_KEY_HG, d=ONE_KEY_D, dv=ONE_KEY_D)  # fmt: skip


def one_key_call(variant: str, dtype_name: str, device: torch.device, gen: torch.Generator):
    """(case, q, k, v, kwargs, rows, keys): a bshd call whose ``rows`` [b, sq, h] (bool) keep
    exactly one key each, ``keys`` [b, sq, h] naming it."""
    case = one_key_case(variant, dtype_name, device.type)
    mask_type, sq, skv, lengths = ONE_KEY[variant]
    b, h, hg, d = case.b, case.h, case.hg, case.d
    dtype = DTYPES[dtype_name]
    q, k, v = (
        torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        for shape in ((b, sq, h, d), (b, skv, hg, d), (b, skv, hg, d))
    )
    kwargs = {"qkv_layout": case.layout, "attn_mask_type": mask_type}
    rows = torch.zeros(b, sq, h, dtype=torch.bool)
    keys = torch.zeros(b, sq, h, dtype=torch.long)
    if variant == "causal":
        rows[:, 0] = True
    elif variant == "causal_bottom_right":
        rows[:, sq - skv] = True
    elif variant == "arbitrary":
        keys = torch.randint(skv, (b, sq, h), generator=gen)
        one = torch.ones(b, h, sq, skv, dtype=torch.bool)  # True = masked out
        one.scatter_(-1, keys.permute(0, 2, 1).unsqueeze(-1), False)
        kwargs["attention_mask"] = one.to(device)
        rows[:] = True
    else:
        cu_kv = [0, lengths[0], lengths[0] + lengths[1]]
        kwargs["cu_seqlens_q"] = torch.tensor([0, sq, 2 * sq], dtype=torch.int32, device=device)
        kwargs["cu_seqlens_kv"] = torch.tensor(cu_kv, dtype=torch.int32, device=device)
        rows[0] = True
    return case, q, k, v, kwargs, rows, keys


def assert_rows_are_value_rows(adapter, case, q, k, v, kwargs, rows, keys, where):
    module = adapter.build(case, case.d**-0.5)
    with torch.no_grad():
        out = adapter.call(module, case, q, k, v, kwargs)[0]
    got = out.view(case.b, case.sq, case.h, case.dv)[rows]
    heads = torch.arange(case.h).view(1, 1, -1).expand_as(keys) // (case.h // case.hg)
    batch = torch.arange(case.b).view(-1, 1, 1).expand_as(keys)
    want = v[batch[rows], keys[rows], heads[rows]]  # [rows, dv]
    assert got.dtype == v.dtype, f"{where}: output dtype {got.dtype}, v {v.dtype}"
    assert_bitwise_equal(f"{where}: the rows with one kept key vs that key's v row", got, want)
