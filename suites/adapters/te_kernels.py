"""Transformer Engine's own fused softmax kernels as an op adapter (tools/te_kernels).

The library is TE's fused_softmax/*.cu built unmodified by tools/te_kernels/build.py; this module
loads it with ctypes and calls it the way TE's transformer_engine/pytorch/csrc/extensions/
softmax.cpp does: the same shape and dtype checks first (`not_supported_reasons`, with TE's
messages, plus the dispatchers' "Unsupported shape." rules that softmax.cpp leaves to them), a
fresh contiguous output, the nvte_* call on the current stream. Nothing here touches CUDA at
import; `unavailable_reason()` says why TE's kernels cannot run (no library, no CUDA device).
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch

from te_conformance.suites.adapters.base import OpAdapter
from te_conformance.suites.skips import Reason
from te_fast import _registry

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LIB = ROOT / "build" / "te_kernels" / "libte_kernels.so"
BUILD_HINT = (
    "TE_SRC=.te_src python tools/te_kernels/build.py build (docs/te_kernels.md), "
    "or TE_KERNELS_LIB=path/to/libte_kernels.so"
)

# TE source lines the limits come from (the TE commit docs/te_kernels.md names)
SOFTMAX_CPP = "transformer_engine/pytorch/csrc/extensions/softmax.cpp"
DTYPES = (torch.float16, torch.bfloat16)
MAX_SK = 16384
# TE's four fused softmaxes are te_fast's softmax ops, by the same names (TE's functions are
# scaled_softmax_forward, ...): the op table is te_fast's registry (te_fast/_registry.py)
SOFTMAX_FORWARDS = {s.public: s for s in _registry.OPS if s.kind == _registry.SOFTMAX_FWD}
RANK = {name: s.rank for name, s in SOFTMAX_FORWARDS.items()}
MASKED = {name for name, s in SOFTMAX_FORWARDS.items() if s.masked}


def _deviation(number: int, title: str, where: str, reproducer: str, checks=("value",)):
    """TE's kernels' deviation ``number`` of docs/te_kernels.md as an expectation
    (suites/expected.py)."""
    from te_conformance.suites.expected import Expectation

    return Expectation(
        source="te_deviation", id=f"kernels-{number}", reason=title, checks=checks,
        adapter="te_kernels", title=title, where=where,
        defined_at="docs/te_kernels.md#te-deviations-read-from-the-source-at-d0067d0-run-on-an-"
        "h100-on-2026-12-06",
        reproducer=f"pytest -m gpu suites/te_fast/test_te_kernels.py -k {reproducer}",
    )  # fmt: skip


# TE's softmax kernels' recorded deviations (docs/te_kernels.md, "TE deviations"): the suites
# expect them where they show (suites/te_fast/test_te_kernels.py); deviation 4 is never run
# (fault_reasons) and deviation 5 is a known failure (suites/known_failures.py).
DEVIATIONS = {
    1: _deviation(1, "a -10000 mask fill beats kept scores: a row whose kept scaled scores are "
                  "all below -10000 and which has a masked column comes back 0",
                  "scaled_masked_softmax.cu:285,313; scaled_aligned_causal_masked_softmax.cu:194",
                  "masked_fill_beats_kept_scores"),
    2: _deviation(2, "masked columns get probability: kept scores near -10000 give each masked "
                  "column exp(-10000 - max) of the weight, not exactly 0",
                  "scaled_masked_softmax.cu:285,313", "masked_columns_get_probability"),
    3: _deviation(3, "aligned causal counts pad columns: the register pad past sk is filled "
                  "with -10000, not -inf (1/32 per column instead of 1/24 at sk = 24)",
                  "scaled_aligned_causal_masked_softmax.cu:200", "aligned_causal_padding_columns"),
}  # fmt: skip


def library_path() -> Path:
    return Path(os.environ.get("TE_KERNELS_LIB") or DEFAULT_LIB)


@cache
def _load() -> tuple[ctypes.CDLL | None, str | None]:
    path = library_path()
    if not path.is_file():
        return None, f"TE's kernels are not built ({path} absent): {BUILD_HINT}"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return None, f"TE's kernels ({path}) do not load: {exc}"
    p, i64p, i, f = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_float
    for op in RANK:
        fwd = getattr(lib, f"te_kernels_{op}_forward")
        fwd.argtypes = [p, p, p, i64p, i64p, i, f, p] if op in MASKED else [p, p, i64p, i, f, p]
        bwd = getattr(lib, f"te_kernels_{op}_backward")
        bwd.argtypes = [p, p, p, i64p, i, f, p]
        fwd.restype = bwd.restype = ctypes.c_int
    lib.te_kernels_last_error.restype = ctypes.c_char_p
    lib.te_kernels_te_commit.restype = ctypes.c_char_p
    return lib, None


def unavailable_reason() -> str | None:
    """Why TE's kernels cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (TE's kernels are CUDA only)"
    return _load()[1]


def te_commit() -> str | None:
    lib = _load()[0]
    return lib.te_kernels_te_commit().decode() if lib is not None else None


# ----------------------------------------------------------------------------- TE's limits


def batches_per_block(sk: int) -> int:
    """Rows one 128-thread block of TE's warp-per-row kernels handles (fused_softmax/*.cu
    dispatchers: warp_size = min(next_pow2(sk), 32), two rows a warp up to 128 columns)."""
    pow2 = 1 << max(sk - 1, 0).bit_length()
    warp = min(pow2, 32)
    return (128 // warp) * (2 if pow2 <= 128 else 1)


def not_supported_reasons(op: str, x_shape, dtype, mask_shape=None, backward=False) -> list[str]:
    """TE's own rejections of a call (softmax.cpp's AT_ASSERTM/TORCH_CHECK texts, then the
    dispatchers' NVTE_CHECK(... "Unsupported shape.")); empty when TE runs the case."""
    out = []
    rank = RANK[op]
    where = f"TE {SOFTMAX_CPP} {op}_{'backward' if backward else 'forward'}"
    if len(x_shape) != rank:
        return [f"{where}: expected {rank}D tensor"]
    if dtype not in DTYPES:
        out.append(f"{where}: Only fp16 and bf16 are supported")
    if rank == 3:
        attn_batches, sq, sk = x_shape
        if sq != sk:  # the forward sizes its output [ab, sq, sq]; the backward checks it
            out.append(f"{where}: sq == sk required (TORCH_CHECK(size(1) == size(2)))")
        if sq > MAX_SK:
            out.append(f"{where}: Sequence length must be 16384 or less")
        elif attn_batches % batches_per_block(sq):
            out.append(
                f"TE fused_softmax/scaled_upper_triang_masked_softmax.cu: Unsupported shape. "
                f"(attn_batches % batches_per_block == 0, batches_per_block = "
                f"{batches_per_block(sq)})"
            )
        return out
    b, _, sq, sk = x_shape
    if sk > MAX_SK:
        out.append(f"{where}: Key sequence length must be 16384 or less")
    if backward:  # softmax.cpp's backwards check dtype and rank only
        return out
    if sk % 8:
        out.append(f"{where}: Key sequence length must be divisible by 8")
    if op == "scaled_aligned_causal_masked_softmax":
        if sq < 1:
            out.append(f"{where}: Query sequence length must be greater or equal to 1")
        return out
    if sq <= 1:
        out.append(f"{where}: Query sequence length must be greater than 1")
    if op in MASKED:
        if mask_shape is None or len(mask_shape) != 4:
            out.append(f"{where}: expected 4D tensor (mask)")
        elif mask_shape[0] not in (1, b) or tuple(mask_shape[1:]) != (1, sq, sk):
            out.append(f"{where}: mask of shape [1|b, 1, sq, sk] (TORCH_CHECKs on mask.size)")
    if sk <= MAX_SK and sq % batches_per_block(sk):
        out.append(
            f"TE fused_softmax/scaled_masked_softmax.cu: Unsupported shape. "
            f"(query_seq_len % batches_per_block == 0, batches_per_block = "
            f"{batches_per_block(sk)})"
        )
    return out


def fault_reasons(op: str, x_shape) -> list[str]:
    """Cases TE accepts but whose run would fault (TE deviation 4, docs/te_kernels.md): the
    upper-triangular kernel loads 4 elements at once from rows of stride s once s > 64, and
    softmax.cpp does not ask s % 4 == 0. A misaligned load kills the CUDA context: never run."""
    if RANK[op] == 3 and len(x_shape) == 3 and x_shape[2] > 64 and x_shape[2] % 4:
        return [
            "TE deviation 4: scaled_upper_triang_masked_softmax.cu:181 vector loads on rows of "
            f"s = {x_shape[2]} (s % 4 != 0): misaligned, not run"
        ]
    return []


# ----------------------------------------------------------------------------- calls


def _shape(t: torch.Tensor):
    return (ctypes.c_int64 * t.dim())(*t.shape)


def _check(rc: int, lib, op: str) -> None:
    if rc != 0:
        raise RuntimeError(f"TE {op}: {lib.te_kernels_last_error().decode()}")


def _lib(op: str, x: torch.Tensor, mask=None, backward=False):
    lib, why = _load()
    if lib is None:
        raise RuntimeError(why)
    shape = None if mask is None else tuple(mask.shape)
    reasons = not_supported_reasons(op, tuple(x.shape), x.dtype, shape, backward)
    reasons += fault_reasons(op, tuple(x.shape))
    if reasons:
        raise ValueError("; ".join(reasons))
    if x.device.type != "cuda":
        raise ValueError(f"TE {op}: CUDA tensors only, got {x.device}")
    if x.data_ptr() % 16:  # TE's tensors come from torch's allocator; its vector loads fault
        raise ValueError(f"TE {op}: x must start 16-byte aligned (TE loads 4 elements at once)")
    return lib


def forward(op: str, x: torch.Tensor, *args) -> torch.Tensor:
    """TE's forward of ``op`` (te_fast's public name): (x, scale) or (x, mask, scale)."""
    mask = args[0] if op in MASKED else None
    scale = float(args[-1])
    lib = _lib(op, x, mask)
    x = x.contiguous()
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    dtype = 1 if x.dtype == torch.bfloat16 else 0
    with torch.cuda.device(x.device):
        stream = ctypes.c_void_p(torch.cuda.current_stream(x.device).cuda_stream)
        fn = getattr(lib, f"te_kernels_{op}_forward")
        if mask is not None:
            mask = mask.contiguous()
            rc = fn(x.data_ptr(), mask.data_ptr(), y.data_ptr(), _shape(x), _shape(mask), dtype,
                    scale, stream)  # fmt: skip
        else:
            rc = fn(x.data_ptr(), y.data_ptr(), _shape(x), dtype, scale, stream)
    _check(rc, lib, f"{op}_forward")
    return y


def backward(op: str, dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    """TE's backward of ``op``: dx = scale * y * (dy - sum(dy * y)), into a fresh buffer as
    softmax.cpp does since TE PR #3201 (before it, dx was written into dy's buffer)."""
    lib = _lib(op, dy, backward=True)
    if y.shape != dy.shape or y.dtype != dy.dtype:
        raise ValueError(f"TE {op}_backward: dy and y of one shape and dtype")
    dy, y = dy.contiguous(), y.contiguous()
    dx = torch.empty_like(dy, memory_format=torch.contiguous_format)
    dtype = 1 if dy.dtype == torch.bfloat16 else 0
    with torch.cuda.device(dy.device):
        stream = ctypes.c_void_p(torch.cuda.current_stream(dy.device).cuda_stream)
        fn = getattr(lib, f"te_kernels_{op}_backward")
        rc = fn(dy.data_ptr(), y.data_ptr(), dx.data_ptr(), _shape(dy), dtype, float(scale), stream)
    _check(rc, lib, f"{op}_backward")
    return dx


class TeKernels(OpAdapter):
    """TE's fused softmax kernels behind te_fast's softmax op table: the ops of the registry it
    has (all four softmax pairs), TE's own rejections and the shapes whose run would fault as
    its declines, its deviations (DEVIATIONS) for the suites to expect."""

    name = "te_kernels"
    ops = tuple(SOFTMAX_FORWARDS)
    deviations = DEVIATIONS

    def unavailable_reason(self, device: str = "cuda") -> str | None:
        return unavailable_reason()

    def declines(self, op: str, x_shape, dtype, mask_shape=None, backward=False) -> list[Reason]:
        found = not_supported_reasons(op, x_shape, dtype, mask_shape, backward)
        found += fault_reasons(op, x_shape)  # TE deviation 4: never run
        return [Reason(text) for text in found]

    def forward(self, op: str, x: torch.Tensor, *args) -> torch.Tensor:
        return forward(op, x, *args)

    def backward(self, op: str, dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        return backward(op, dy, y, scale)


TE_KERNELS = TeKernels()
