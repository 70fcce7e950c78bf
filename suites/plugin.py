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


def pytest_report_header(config):
    """torch's threads per xdist worker and where ref64 is computed (suites/pinning.py)."""
    from suites import pinning

    return [pinning.header(config)]


def pytest_te_report_impls(config):
    """reports.plugin's hook: the adapters this run judges, with their implementations'
    versions (Adapter.version)."""
    from suites.adapters import selected

    return [{"name": a.name, "version": a.version()} for a in selected(config)]


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


def _adapter_and_case(item):
    """The item's ``adapter`` parameter (an Adapter, or None) and its AttnCase parameter (the
    first parameter that is one, or None)."""
    from suites.adapters.base import Adapter
    from suites.cases import AttnCase

    params = getattr(getattr(item, "callspec", None), "params", {})
    adapter = params.get("adapter")
    case = next((v for v in params.values() if isinstance(v, AttnCase)), None)
    return (adapter if isinstance(adapter, Adapter) else None), case


def declared_differences(item) -> list:
    """The differences the item's ``adapter`` parameter declares (Adapter.differences) that
    match the item: its function name, parameter id and AttnCase parameter."""
    adapter, case = _adapter_and_case(item)
    if adapter is None or not adapter.differences:
        return []
    test = getattr(item, "originalname", None) or item.name.partition("[")[0]
    param_id = getattr(getattr(item, "callspec", None), "id", "")
    return [d for d in adapter.differences if d.matches(test, param_id, case)]


def pytest_collection_modifyitems(config, items):
    """Expected failures, each a STRICT and NARROW xfail, recorded on the item for the report
    (reports.record.expected_on): suites/known_failures.py (counts only when the named tensors
    fail their error-ratio assertion and nothing else) and the differences an item's adapter
    declares (suites/adapters/base.py Difference: counts only when the declared tensors fail
    value checks and nothing else). Both apply to one item as one xfail over their union."""
    from reports import record
    from suites.checks.numerics import value_failures
    from suites.known_failures import KNOWN_FAILURES, defined_at

    for item in items:
        nodeid = suite_nodeid(item)
        known = KNOWN_FAILURES.get(nodeid)
        declared = declared_differences(item)
        if known is None and not declared:
            continue
        adapter, _ = _adapter_and_case(item)
        by = {"adapter": adapter.name} if adapter is not None else {}
        reasons, tensors = [], []
        if known is not None:
            reasons.append(known.marker_reason())
            tensors += known.tensors
            record.expected_on(
                item, source="known_failure", **by, tensors=list(known.tensors),
                reason=known.reason, defined_at=defined_at(nodeid), strict=known.strict,
            )  # fmt: skip
        for d in declared:
            reasons.append(
                f"declared difference of {adapter.name}: {','.join(d.tensors)} (value checks, "
                f"{'strict' if d.strict else 'not strict: machine-dependent rounding'}): "
                f"{d.reason} [{d.defined_at}]"
            )
            tensors += [t for t in d.tensors if t not in tensors]
            record.expected_on(
                item, source="declared", **by, tensors=list(d.tensors), reason=d.reason,
                defined_at=d.defined_at, strict=d.strict,
            )  # fmt: skip
        raises = known.raises if not declared else value_failures(tensors)
        # strict unless every expectation applied is a machine-dependent rounding difference
        strict = (known is not None and known.strict) or any(d.strict for d in declared)
        item.add_marker(pytest.mark.xfail(reason="; ".join(reasons), strict=strict, raises=raises))


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
