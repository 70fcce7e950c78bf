"""The suites' pytest plugin: --impl, markers, seeding, pinning, known failures, the report plugin.

Installed with the project, it is registered through the `pytest11` entry point named
"te_conformance.suites.plugin" (pyproject.toml), so the suites run from any directory:
`pytest --pyargs te_conformance.suites`.
The checkout's conftest.py names the same module in `pytest_plugins`; pytest registers a plugin
once per name, so inside the checkout the two routes meet as one registration, and with
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 the conftest alone still loads it.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path

import pytest

from te_conformance.reports.record import PROPERTY_KEY
from te_conformance.suites import expected

pytest_plugins = ["te_conformance.reports.plugin"]

SUITES_DIR = Path(__file__).resolve().parent

CONFORMANCE = "conformance"  # the marker of the tests that take an adapter (--impl runs them)
MARKERS = (
    "gpu: needs a CUDA device (skipped with a reason on CPU-only machines)",
    "slow: long-running case",
    "large: tensors past 2^31 elements (GPU, up to ~40 GiB each; run only when selected: -m large)",
    "matrix(name): run over the named case matrix (suites/cases.py MODULE_MATRICES) for every "
    "selected adapter",
    "feature(*features): the features every case of the test exercises (keys of "
    "suites/features.py FEATURES, or a Feature of the test's own), recorded with each case for "
    "the conformance matrix",
    "per_adapter(**axes): parametrize over axes (argname=values, in id order) and the selected "
    "adapters, which join the last axis's id (bare for te_fast); see suites/adapters/__init__.py",
    f"{CONFORMANCE}: set by the suites' plugin on every test that takes an adapter (the "
    "conformance room); --impl runs these alone, as -m conformance",
)


def _register_fuzz_profiles() -> None:
    from te_conformance.suites.fuzz import profiles

    profiles.register()


_register_fuzz_profiles()  # at import: before hypothesis reads --hypothesis-profile


def pytest_addoption(parser):
    from te_conformance.suites.adapters import ADAPTERS, ENTRY_POINT_GROUP, entry_point_names

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
    from te_conformance.suites import pinning

    for line in MARKERS:
        config.addinivalue_line("markers", line)
    pinning.configure(config)
    if config.getoption("--impl"):
        select_conformance(config)


def select_conformance(config) -> None:
    """--impl judges the named adapters: the run keeps the tests that take one, by pytest's own
    -m (the marker pytest_itemcollected sets), so that the report records the selection and
    compares the run with a baseline on the cases it selects alone (a subset run): a run of
    --impl te_fast answers to the default run's baseline for its conformance cases. Applied
    once however often configure runs (an xdist worker gets the controller's options)."""
    old = config.option.markexpr or ""
    if old == CONFORMANCE or old.endswith(f") and {CONFORMANCE}"):
        return
    config.option.markexpr = f"({old}) and {CONFORMANCE}" if old else CONFORMANCE


def pytest_itemcollected(item):
    """The tests that take an ``adapter`` carry the conformance marker (what --impl selects)."""
    if "adapter" in getattr(item, "fixturenames", ()):
        item.add_marker(CONFORMANCE)


def pytest_report_header(config):
    """torch's threads per xdist worker and where ref64 is computed (suites/pinning.py)."""
    from te_conformance.suites import pinning

    return [pinning.header(config)]


def pytest_te_report_features(config):
    """The report plugin's hook: the feature catalogue the cases' ``features`` refer to."""
    from te_conformance.suites import features

    return features.catalogue()


def pytest_te_report_impls(config):
    """The report plugin's hook: the adapters this run judges, with their implementations'
    versions (Adapter.version)."""
    from te_conformance.suites.adapters import selected

    return [{"name": a.name, "version": a.version()} for a in selected(config)]


def pytest_generate_tests(metafunc):
    """``@pytest.mark.per_adapter(**axes)``: the axes and the selected adapters
    (suites.adapters.parametrize_per_adapter)."""
    per_adapter = metafunc.definition.get_closest_marker("per_adapter")
    if per_adapter is not None:
        from te_conformance.suites.adapters import parametrize_per_adapter

        parametrize_per_adapter(metafunc, per_adapter.kwargs)


def seed_key(item) -> str:
    """The text an item's random draws are seeded from: its case key in the form node ids had
    before the suites had rooms ("suites/<file>.py::<test>[<params>]"), so that a test moved
    into a room keeps the draws its known failures and baselines were measured on."""
    stem, _, rest = item_key(item).partition("::")
    return f"suites/{stem}.py::{rest}" if rest else stem


def item_key(item) -> str:
    """The item's case key (te_conformance.reports.model.case_key: its test file's stem, then
    its names and parameters), whatever the rootdir, wherever the suites are installed and in
    whichever room: the key of suites/known_failures.py and the seed of the item's random
    draws."""
    from te_conformance.reports.model import case_key

    return case_key(item.nodeid)


def _adapter_and_case(item):
    """The item's ``adapter`` parameter (an Adapter, or None) and its AttnCase parameter (the
    first parameter that is one, or None)."""
    from te_conformance.suites.adapters.base import Adapter
    from te_conformance.suites.cases import AttnCase

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


ROOMS = {
    "conformance": "any implementation's conformance: every test takes an adapter",
    "te_fast": "te_fast's own tests: no adapter",
    "judge": "the judge's own tests (te_ref, the checks): no adapter",
}


def _room(item) -> str | None:
    """The room (a folder of suites/, ROOMS) an item of the suites is in; None outside them."""
    path = getattr(item, "path", None)
    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(SUITES_DIR).parts[0]
    except ValueError:
        return None


def check_rooms(items) -> None:
    """A UsageError naming each test of the suites in the wrong room: the conformance room holds
    the tests that take an ``adapter`` and only those (--impl selects them by that fact)."""
    wrong = []
    for item in items:
        room = _room(item)
        if room is None:
            continue
        takes = "adapter" in getattr(item, "fixturenames", ())
        if room not in ROOMS:
            wrong.append(f"{item.nodeid}: not in a room ({', '.join(ROOMS)})")
        elif takes != (room == "conformance"):
            wrong.append(f"{item.nodeid}: {'takes' if takes else 'takes no'} adapter, in "
                         f"suites/{room}/ ({ROOMS[room]})")  # fmt: skip
    if wrong:
        raise pytest.UsageError("tests in the wrong room of suites/:\n  " + "\n  ".join(wrong[:20]))


def pytest_collection_modifyitems(config, items):
    """The rooms (check_rooms) and the expected failures known at collection
    (suites/expected.py): suites/known_failures.py by case key and the differences the item's
    adapter declares (Adapter.differences). --impl's selection is pytest's own -m
    (select_conformance)."""
    from te_conformance.suites.known_failures import KNOWN_FAILURES

    check_rooms(items)
    for item in items:
        marker_features(item)  # a UsageError for an unknown or clashing feature
        key = item_key(item)
        adapter, _ = _adapter_and_case(item)
        found = [KNOWN_FAILURES[key].expectation(key)] if key in KNOWN_FAILURES else []
        found += [d.expectation(adapter.name) for d in declared_differences(item)]
        if found:
            expected.attach(item, *found)


def marker_features(item) -> tuple[list[str], list[dict]]:
    """The features a test declares with ``@pytest.mark.feature(...)``: (keys, definitions).
    An argument is a key of the catalogue (suites/features.py FEATURES) or a ``Feature`` of the
    test's own (a new row, defined where it is exercised: its definition travels with the
    cases, and the report adds it to the run's catalogue); anything else is a UsageError."""
    from te_conformance.suites.features import BY_KEY, Feature

    keys: list[str] = []
    defined: list[dict] = []
    for arg in (a for m in item.iter_markers("feature") for a in m.args):
        if isinstance(arg, Feature):
            if arg.key in BY_KEY and BY_KEY[arg.key] != arg:
                raise pytest.UsageError(
                    f"{item.nodeid}: feature {arg.key!r} is defined differently in "
                    "suites/features.py; use its key, or give the new feature a key of its own"
                )
            keys.append(arg.key)
            defined.append(arg.as_dict())
        elif isinstance(arg, str) and arg in BY_KEY:
            keys.append(arg)
        else:
            raise pytest.UsageError(
                f"{item.nodeid}: unknown feature {arg!r}: a key of suites/features.py "
                f"({', '.join(sorted(BY_KEY))}) or a Feature(key, group, label, rule) of the "
                "test's own"
            )
    return keys, defined


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """The features the test declares (marker_features), recorded for each of its cases."""
    keys, defined = marker_features(item)
    if keys:
        declared = {"kind": "features", "keys": keys, "declared": True, "defines": defined}
        item.user_properties.append((PROPERTY_KEY, declared))
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    expected.set_current(item)
    try:
        return (yield)
    finally:
        expected.set_current(None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """The one place expected failures are applied (suites/expected.py settle): the call's
    outcome under the item's expectations, each applied one recorded for the report."""
    report = yield
    command = expected.reproducer_of(item) if call.when == "call" and report.failed else None
    if command:  # the command that shows this failure on its own (a fuzz check's example)
        entry = (PROPERTY_KEY, {"kind": "reproducer", "command": command})
        item.user_properties.append(entry)
        report.user_properties.append(entry)
    found = expected.of(item)
    if call.when != "call" or not found:
        return report
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, (pytest.skip.Exception, pytest.xfail.Exception)):
        return report  # the test skipped itself: nothing was judged
    verdict = expected.settle(found, error)
    if verdict.outcome == "xfailed":
        report.outcome, report.wasxfail = "skipped", verdict.reason
    elif verdict.outcome == "xpassed":
        report.outcome, report.wasxfail = "passed", verdict.reason
    elif verdict.outcome == "failed" and error is None:
        report.outcome, report.longrepr = "failed", verdict.why
    elif verdict.outcome == "failed" and hasattr(report.longrepr, "addsection"):
        report.longrepr.addsection("expected differences", verdict.why)
    for e in found:
        entry = (PROPERTY_KEY, {"kind": "expected", **e.record(), "outcome": report.outcome})
        item.user_properties.append(entry)
        report.user_properties.append(entry)
    return report


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


@pytest.fixture
def fuzz_key(request) -> str:
    """The seed of the test's draws (seed_key)."""
    return seed_key(request.node)


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
    """Every test gets its own fixed seed, derived from its seed_key (reproducible, independent
    of the order, the rootdir and the room)."""
    if _ours(request.config, getattr(request.node, "path", None)):
        import torch

        seed = zlib.crc32(seed_key(request.node).encode())
        random.seed(seed)
        torch.manual_seed(seed)  # lazily seeds CUDA too, without initialising it
    yield
