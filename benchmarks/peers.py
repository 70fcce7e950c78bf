"""What te_fast is measured against: torch composites, inductor, SDPA and the Triton peer."""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------- softmax composites


def softmax_plain(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The composite an unfused model writes: (x * scale).softmax(-1)."""
    return (x * scale).softmax(-1)


def softmax_masked(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Masked composite; mask bool [b, 1, sq, sk], True = masked out (broadcast over heads)."""
    return (x * scale).masked_fill(mask, float("-inf")).softmax(-1)


def torch_softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Eager torch's softmax backward kernel (no scale): y * (dy - sum(dy * y))."""
    return torch._softmax_backward_data(dy, y, -1, y.dtype)


def triton_softmax():
    """The Triton peer's softmax(x, scale); imports triton, so only call it on a CUDA machine."""
    from benchmarks import triton_softmax as mod

    return mod.softmax


# ----------------------------------------------------------------------------- attention composites


def composite_attention(q, k, v, masked, scale: float):
    """matmul, scale, mask, softmax, matmul on bshd q/k/v -> [b, s, h*d].

    masked: bool broadcastable to (b, h, sq, skv), True = masked out.
    """
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d)
    scores = torch.matmul(qh, kh.transpose(-2, -1)) * scale  # (b, h, sq, skv)
    probs = scores.masked_fill(masked, float("-inf")).softmax(-1)
    out = torch.matmul(probs, vh)  # (b, h, sq, d)
    b, h, s, d = out.shape
    return out.transpose(1, 2).reshape(b, s, h * d)  # (b, s, h*d)


def sdpa_attention(q, k, v, keep, causal: bool, scale: float):
    """torch SDPA on bshd q/k/v -> [b, s, h*d]; keep: bool (True = attend) or None."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d)
    out = torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=keep, is_causal=causal, scale=scale
    )  # (b, h, s, d)
    b, h, s, d = out.shape
    return out.transpose(1, 2).reshape(b, s, h * d)


SDPA_FUSED = ("flash", "efficient", "cudnn")


def sdpa_backend(name: str):
    """Context manager restricting SDPA to one backend: math | flash | efficient | cudnn."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "math": SDPBackend.MATH,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[name]
    return sdpa_kernel(backend)


# ----------------------------------------------------------------------------- compile


def dynamo_settings():
    """Never fall back to eager silently: a hit recompile limit is an error, not a slow row.

    A context manager (config.patch), so an in-process run leaves dynamo as it found it.
    """
    cfg = torch._dynamo.config
    settings = {}
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            settings[name] = 64
            break
    for name in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, name):
            settings[name] = True
            break
    return cfg.patch(**settings)


def reset_compile_state() -> None:
    """Fresh dynamo caches and CUDA-graph trees, so one compiled case cannot leak into the next."""
    torch._dynamo.reset()
    if torch.cuda.is_available():
        from torch._inductor import cudagraph_trees

        cudagraph_trees.reset_cudagraph_trees()


def compile_counters() -> dict:
    from torch._dynamo.utils import counters

    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
    }


def compile(fn, *, smoke: bool, mode: str | None = None, dynamic: bool = False):
    """torch.compile(fullgraph=True); on the CPU smoke run the 'eager' backend (tracing only)."""
    if smoke:
        return torch.compile(fn, backend="eager", fullgraph=True, dynamic=dynamic)
    kwargs = {"mode": mode} if mode else {}
    return torch.compile(fn, fullgraph=True, dynamic=dynamic, **kwargs)


def mark_step(mode: str | None) -> None:
    """Call before each iteration of a reduce-overhead (CUDA-graph) callable."""
    if mode == "reduce-overhead" and torch.cuda.is_available():
        torch.compiler.cudagraph_mark_step_begin()
