"""te_fast/_eager_softmax.py: the eager autograd path gives bit for bit what the registered op
autograd gives (forward, backward, double backward, no-grad), and traces still see the op
itself."""

from __future__ import annotations

import pytest
import torch

te_fast = pytest.importorskip("te_fast")
if te_fast.UNAVAILABLE_REASON is not None:
    pytest.skip(f"te_fast unavailable: {te_fast.UNAVAILABLE_REASON}", allow_module_level=True)

from te_fast import _eager_softmax  # noqa: E402

B, H, SQ, SK = 2, 3, 5, 7


def _inputs(name, dtype, seed):
    torch.manual_seed(seed)
    x = torch.randn(B, H, SQ, SK, dtype=dtype) * 3
    mask = None
    rows = None
    if name == "scaled_masked_softmax_fwd":
        mask = torch.rand(B, 1, SQ, SK) < 0.3
        mask[0, 0, 1] = True  # a fully masked row
    if name == "scaled_upper_triang_masked_softmax_fwd":
        rows = (B * H, SQ, SK)
    return x, mask, rows


def _registered(name, x, mask, scale, rows):
    """The op through its registered autograd (the path before te_fast/_eager_softmax.py)."""
    op = getattr(torch.ops.te_fast, name).default
    xr = x if rows is None else x.reshape(rows)
    y = op(xr, scale) if mask is None else op(xr, mask, scale)
    return y.view(x.shape)


NAMES = (
    "scaled_softmax_fwd",
    "scaled_masked_softmax_fwd",
    "scaled_upper_triang_masked_softmax_fwd",
    "scaled_aligned_causal_masked_softmax_fwd",
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", NAMES)
def test_eager_equals_registered_autograd(name, dtype):
    x, mask, rows = _inputs(name, dtype, 1)
    dy = torch.randn_like(x)
    g = torch.randn_like(x)
    results = []
    for fn in (_eager_softmax.softmax, _registered):
        xg = x.clone().requires_grad_()
        y = fn(name, xg, mask, 0.7, rows)
        (dx,) = torch.autograd.grad(y, xg, dy, create_graph=True)
        (ddy_x,) = torch.autograd.grad(dx, xg, g)  # double backward: through the bwd op
        dx_plain = torch.autograd.grad(fn(name, xg, mask, 0.7, rows), xg, dy)[0]
        with torch.no_grad():
            y_nograd = fn(name, xg, mask, 0.7, rows)
        assert y.grad_fn is not None and not y_nograd.requires_grad
        results.append((y, dx, ddy_x, dx_plain, y_nograd))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_eager_reads_no_input_grad_from_mask_and_keeps_dy():
    x, mask, _ = _inputs("scaled_masked_softmax_fwd", torch.float32, 2)
    x.requires_grad_()
    dy = torch.randn_like(x)
    dy_before = dy.clone()
    y = _eager_softmax.softmax("scaled_masked_softmax_fwd", x, mask, 1.0)
    y.backward(dy)
    assert torch.equal(dy, dy_before)
    assert x.grad is not None and mask.grad is None


def test_traces_see_the_op():
    """Under torch.compile the registered op (not the eager Function) is what gets traced."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def f(x):
        return _eager_softmax.softmax("scaled_aligned_causal_masked_softmax_fwd", x, None, 0.5)

    x = torch.randn(B, H, SQ, SK, requires_grad=True)
    out = torch.compile(f, backend=backend, fullgraph=True)(x)
    assert any("scaled_aligned_causal_masked_softmax_fwd" in t for t in seen), seen
    assert not any("_Softmax" in t or "autograd_function" in t for t in seen), seen
    torch.testing.assert_close(out, f(x), rtol=0, atol=0)


