"""Deliberately broken custom ops, each breaking one SPEC §3 contract (for test_selftest.py)."""

from __future__ import annotations

import torch


@torch.library.custom_op("te_selftest::writes_its_input", mutates_args=())
def writes_its_input(x: torch.Tensor) -> torch.Tensor:
    """Declared pure, but scales its input in place."""
    y = torch.softmax(x, -1)
    x.mul_(0.5)
    return y


@writes_its_input.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("te_selftest::default_stream_launch", mutates_args=())
def default_stream_launch(x: torch.Tensor) -> torch.Tensor:
    """Launches on the device's default stream instead of the current one."""
    with torch.cuda.stream(torch.cuda.default_stream(x.device)):
        return torch.softmax(x, -1)


@default_stream_launch.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("te_selftest::reads_item", mutates_args=())
def reads_item(x: torch.Tensor) -> torch.Tensor:
    """Reads a device value on the host (.item()): a host synchronisation."""
    scale = 1.0 / max(float(x.abs().max().item()), 1.0)
    return torch.softmax(x * scale, -1)


@reads_item.register_fake
def _(x):
    return torch.empty_like(x)
