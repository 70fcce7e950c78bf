"""Thin pytest glue: xdist GPU pinning, suite options, per-test seeding, the report plugin."""

import random
import zlib

import pytest
import torch

from suites import pinning

pytest_plugins = ["reports.plugin"]


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        action="append",
        default=None,
        help="run the attention/compile suites only for these adapters (repeatable), "
        "e.g. --impl te_fast --impl te_fast.compiled; default: every registered adapter",
    )


def pytest_configure(config):
    pinning.configure(config)


@pytest.fixture(autouse=True)
def _seed(request):
    """Every test gets its own fixed seed, derived from its id (reproducible, order-independent)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    torch.manual_seed(seed)  # lazily seeds CUDA too, without initialising it
    yield
