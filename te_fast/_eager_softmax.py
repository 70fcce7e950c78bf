"""Eager-mode autograd for the te_fast softmax ops: one C++ autograd node per softmax.

The autograd that ``torch.library.register_autograd`` puts on an op is a Python kernel at the
Autograd dispatch key: every call goes C++ -> Python (argument boxing, ``fill_defaults``, a
generated ``autograd.Function``) -> C++, and so does every backward op call, even with grad off.
At small shapes that host time is larger than the kernels. Here the forward and backward ops are
called below autograd and one C++ autograd node (the op ``te_fast::eager_softmax``,
csrc/eager.cpp) records the same formula (``dx = <op>_bwd(dy, y, scale)``) - same kernels, same
results. (A Python ``autograd.Function`` in its place cost ~15 us more per softmax forward and
backward: 51 against 36 us on a loaded 2-core x86 CPU; docs/performance.md.)

Only for plain eager calls: under ``torch.compile``/``torch.export`` (and functorch transforms)
``softmax`` calls the op itself, so a trace sees the op and its registered autograd exactly as
before. The attention core (te_fast/_attention_core.py) calls its softmax rows through here.
"""

from __future__ import annotations

import torch

from te_fast import _registry as reg
from te_fast._loader import UNAVAILABLE_REASON

_below_autograd = torch._C._AutoDispatchBelowAutograd
_is_compiling = torch.compiler.is_compiling
_functorch_active = torch._C._are_functorch_transforms_active


def plain_eager() -> bool:
    """Whether this is a plain eager call: traces (torch.compile, export, functorch transforms)
    see the ops themselves and their registered autograd."""
    return not (_is_compiling() or _functorch_active())


def _op(name: str):
    return getattr(torch.ops.te_fast, name).default


def _run(fwd, x, mask, scale, rows):
    """fwd(x[, mask], scale), on x.reshape(rows) and viewed back to x's shape when rows is given."""
    xr = x if rows is None else x.reshape(rows)
    y = fwd(xr, scale) if mask is None else fwd(xr, mask, scale)
    return y if rows is None else y.view(x.shape)


_PAIRS = (
    {}
    if UNAVAILABLE_REASON is not None
    else {s.name: (_op(s.name), _op(s.backward)) for s in reg.OPS if s.kind == reg.SOFTMAX_FWD}
)
# y = <name>(x[, mask], scale) with dx = <name less _fwd>_bwd(dy, y, scale) recorded as one C++
# autograd node (csrc/eager.cpp): (name, x, mask, scale, rows), rows as in softmax below.
_EAGER_SOFTMAX = None if UNAVAILABLE_REASON is not None else _op("eager_softmax")


def softmax(
    name: str, x: torch.Tensor, mask: torch.Tensor | None, scale: float, rows: tuple | None = None
) -> torch.Tensor:
    """The te_fast softmax forward op ``name`` (e.g. "scaled_softmax_fwd") on x [, mask].

    rows: run the op on x.view(rows) (x contiguous) and view the result back to x's shape.
    """
    if UNAVAILABLE_REASON is not None:
        raise RuntimeError(UNAVAILABLE_REASON)
    fwd, _ = _PAIRS[name]
    if not plain_eager():
        return _run(fwd, x, mask, scale, rows)
    if torch.is_grad_enabled() and x.requires_grad:  # one C++ autograd node (csrc/eager.cpp)
        return _EAGER_SOFTMAX(name, x, mask, scale, rows)
    with _below_autograd():  # nothing to record: what the registered kernel would redispatch to
        return _run(fwd, x, mask, scale, rows)
