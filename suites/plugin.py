"""The suites' pytest plugin: --impl, markers, seeding, pinning, known failures, the report plugin.

Installed with the project, it is registered through the `pytest11` entry point named
"suites.plugin" (pyproject.toml), so the suites run from any directory: `pytest --pyargs suites`.
The checkout's conftest.py names the same module in `pytest_plugins`; pytest registers a plugin
once per name, so inside the checkout the two routes meet as one registration, and with
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 the conftest alone still loads it.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

pytest_plugins = ["reports.plugin"]

SUITES_DIR = Path(__file__).resolve().parent

MARKERS = (
    "gpu: needs a CUDA device (skipped with a reason on CPU-only machines)",
    "slow: long-running case",
    "large: tensors past 2^31 elements (GPU, up to ~40 GiB each; run only when selected: -m large)",
    "matrix(name): run over the named case matrix (suites/test_attention.py MATRICES) for every "
    "selected adapter",
    "per_adapter(**axes): parametrize over axes (argname=values, in id order) and the selected "
    "adapters, which join the last axis's id (bare for te_fast); see suites/adapters/__init__.py",
)


def _register_fuzz_profiles() -> None:
    from suites.fuzz import profiles

    profiles.register()


_register_fuzz_profiles()  # at import: before hypothesis reads --hypothesis-profile


def pytest_addoption(parser):
    from suites.adapters import ADAPTERS, ENTRY_POINT_GROUP, entry_point_names

    default = [name for name, adapter in ADAPTERS.items() if adapter.default]
    known = [*ADAPTERS, *(n for n in entry_point_names() if n not in ADAPTERS)]
    parser.addoption(
        "--impl",
        action="append",
        default=None,
        metavar="NAME",
        help="run the attention and compile suites for this adapter (repeatable): a registered "
        f"name ({', '.join(known)}; suites/adapters/ and the {ENTRY_POINT_GROUP!r} entry points) "
        f"or package.module:Class; default: {', '.join(default)}",
    )


def pytest_configure(config):
    from suites import pinning

    for line in MARKERS:
        config.addinivalue_line("markers", line)
    pinning.configure(config)


def pytest_generate_tests(metafunc):
    """``@pytest.mark.per_adapter(**axes)``: the axes and the selected adapters
    (suites.adapters.parametrize_per_adapter)."""
    per_adapter = metafunc.definition.get_closest_marker("per_adapter")
    if per_adapter is not None:
        from suites.adapters import parametrize_per_adapter

        parametrize_per_adapter(metafunc, per_adapter.kwargs)


def suite_nodeid(item) -> str:
    """The item's nodeid as the checkout names it ('suites/test_x.py::...'), wherever the suites
    are installed and whatever the rootdir: the key of suites/known_failures.py."""
    path = getattr(item, "path", None)
    if path is not None and "::" in item.nodeid:
        try:
            rel = Path(path).resolve().relative_to(SUITES_DIR.parent)
        except ValueError:
            return item.nodeid
        return f"{rel.as_posix()}::{item.nodeid.split('::', 1)[1]}"
    return item.nodeid


def pytest_collection_modifyitems(config, items):
    """suites/known_failures.py: recorded failures run as strict xfails that count only when
    the named tensor fails its error-ratio assertion and nothing else (raises=)."""
    from suites.known_failures import KNOWN_FAILURES

    for item in items:
        known = KNOWN_FAILURES.get(suite_nodeid(item))
        if known is not None:
            item.add_marker(
                pytest.mark.xfail(reason=known.marker_reason(), strict=True, raises=known.raises)
            )


@pytest.fixture
def one_thread():
    """For tests on tensors of a few dozen elements: torch's intra-op threads only add
    spin-waits (on a busy 2-core CI box they made such tests 20x slower), so run them on one
    thread, then restore."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _ours(config, path) -> bool:
    """The suites' tests, wherever installed, and every test of this project's checkout; the
    plugin is installed into an environment, and other projects' tests there are left alone."""
    if path is None:
        return False
    path = Path(path).resolve()
    if path.is_relative_to(SUITES_DIR):
        return True
    root = Path(config.rootpath)
    return (root / "suites" / "plugin.py").is_file() and path.is_relative_to(root.resolve())


@pytest.fixture(autouse=True)
def _seed(request):
    """Every test gets its own fixed seed, derived from its id (reproducible, order-independent)."""
    if _ours(request.config, getattr(request.node, "path", None)):
        import torch

        seed = zlib.crc32(suite_nodeid(request.node).encode())
        random.seed(seed)
        torch.manual_seed(seed)  # lazily seeds CUDA too, without initialising it
    yield
