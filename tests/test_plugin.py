"""Registering adapters without editing the project (--impl package.module:Class, the
te_conformance.adapters entry points) and the suites as an installed pytest plugin (pytest11)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import te_conformance.suites as suites
from te_conformance.suites.adapters import ADAPTERS, ENTRY_POINT_GROUP, entry_point_names, resolve
from te_conformance.suites.adapters.base import Adapter, Support
from te_conformance.suites.cases import AttnCase

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_SRC = ROOT / "examples" / "my_attention" / "src"

FAKE_ADAPTER = '''
from te_conformance.suites.adapters.torch_sdpa import TorchSdpa


class FakeSdpa(TorchSdpa):
    """torch.sdpa under another name: an adapter an installed package provides."""

    name = "fake_sdpa"
'''


def _child_env(*paths: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _pytest(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def fake_distribution(tmp_path, monkeypatch) -> Path:
    """A distribution on sys.path whose entry point `fake_sdpa` (te_conformance.adapters) names
    fake_adapter_mod:FakeSdpa, as `pip install` of a third-party package would leave it."""
    (tmp_path / "fake_adapter_mod.py").write_text(FAKE_ADAPTER)
    info = tmp_path / "fake_adapters-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-adapters\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nfake_sdpa = fake_adapter_mod:FakeSdpa\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    return tmp_path


def test_module_class_spec_resolves_to_an_instance():
    adapter = resolve("suites.adapters.torch_sdpa:TorchSdpa")
    assert type(adapter).__name__ == "TorchSdpa" and adapter is not ADAPTERS["torch.sdpa"]
    assert resolve("suites.adapters.torch_sdpa:TorchSdpa") is adapter  # one instance per spec


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz:Mine", "cannot import 'no_such_module_xyz'"),
        ("suites.adapters.torch_sdpa:Missing", "has no 'Missing'"),
        ("suites.cases:AttnCase", "is no suites.adapters.base.Adapter subclass"),
        ("no_such_adapter", "unknown; known adapters: ["),
    ],
)
def test_bad_specs_are_usage_errors(spec, message):
    with pytest.raises(pytest.UsageError, match=message.replace("[", r"\[")):
        resolve(spec)


def test_entry_point_resolves(fake_distribution):
    assert "fake_sdpa" in entry_point_names()
    adapter = resolve("fake_sdpa")
    assert isinstance(adapter, Adapter) and adapter.name == "fake_sdpa"


def test_module_class_route_runs_the_suites():
    """The example adapter named by module:Class (not installed, only importable)."""
    result = _pytest(
        ["-q", "--impl", "my_attention.adapter:MyAttentionAdapter",
         "suites/conformance/test_attention.py",
         "-k", "test_core and (bshd_bshd_bshd-fp32-causal-cpu"
         " or thd_thd_thd-fp32-padding_causal-cpu)"],
        ROOT, _child_env(EXAMPLE_SRC),
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "1 passed, 1 skipped" in out, out[-3000:]


def test_entry_point_route_runs_the_suites(fake_distribution):
    result = _pytest(
        ["-q", "-rs", "--impl", "fake_sdpa", "suites/conformance/test_attention.py",
         "-k", "test_core and bshd_bshd_bshd-fp32 and cpu and (causal or padding_causal)"],
        ROOT, _child_env(fake_distribution),
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert " passed" in out, out[-3000:]
    assert "fake_sdpa does not support mask type 'padding_causal'" in out, out[-3000:]


def test_impl_help_lists_entry_points(fake_distribution):
    result = _pytest(["--help"], ROOT, _child_env(fake_distribution))
    assert "fake_sdpa" in result.stdout and "package.module:Class" in result.stdout


def test_plugin_loads_outside_the_checkout(tmp_path):
    """The pytest11 entry point gives --impl, the markers and the fixtures to a pytest started
    anywhere: `pytest --pyargs te_conformance.suites...` (before: "no option named '--impl'")."""
    points = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    if "te_conformance.suites.plugin" not in points:
        pytest.skip("te-conformance is not installed (pip install -e .): no pytest11 entry point")
    result = _pytest(
        ["-q", "--strict-markers", "--pyargs", "te_conformance.suites.conformance.test_attention",
         "--impl", "torch.sdpa",
         "-k", "test_core and bshd_bshd_bshd-fp32-causal-cpu"],
        tmp_path, _child_env(),
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "1 passed" in out, out[-3000:]


def test_plugin_registered_once_inside_the_checkout():
    """Entry point and conftest.py name the same plugin: no double registration; with
    autoloading off, conftest.py alone loads it."""
    for env in ({}, {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}):
        result = _pytest(
            ["--collect-only", "-q", "--impl", "torch.sdpa", "suites/conformance/test_attention.py",
             "-k", "test_core and bshd_bshd_bshd-fp32-causal-cpu"],
            ROOT, {**_child_env(), **env},
        )  # fmt: skip
        out = result.stdout + result.stderr
        assert result.returncode == 0, (env, out[-3000:])
        assert "test_core[bshd_bshd_bshd-fp32-causal-cpu-torch.sdpa]" in out, out[-3000:]


def test_optional_arguments_skip_with_reasons():
    class Plain(Adapter):
        name = "plain"
        support = Support(arguments=("window_size",),
                          why={"bottom_right_diagonal": "no alignment override"})

    plain = Plain()
    case = AttnCase("bshd_bshd_bshd", "fp32", "causal", "cpu", bottom_right_diagonal=True)
    assert [r.text for r in plain.declines(case)] == [
        "plain takes no bottom_right_diagonal (an alignment override): no alignment override"
    ]
    cases = {
        ("alibi_slopes", "alibi"): AttnCase("bshd_bshd_bshd", "fp32", "causal", "cpu",
                                            bias_type="alibi", alibi_slopes="h"),
        ("softmax_offset", "softmax_learnable"): AttnCase("bshd_bshd_bshd", "fp32", "causal",
                                                          "cpu", softmax_type="learnable"),
        ("cu_seqlens_q/cu_seqlens_kv", "mask_padding"): AttnCase("bshd_bshd_bshd", "fp32",
                                                                 "padding", "cpu"),
        ("attention_mask as a padding mask", "mask_padding"): AttnCase(
            "bshd_bshd_bshd", "fp32", "padding", "cpu", padding_from="mask"),
        ("attention_mask as a padding mask", "mask_padding_causal"): AttnCase(
            "bshd_bshd_bshd", "fp32", "padding_causal", "cpu", padding_from="mask_left"),
    }  # fmt: skip
    for (what, feature), case in cases.items():
        (reason,) = plain.declines(case)
        assert reason.text.startswith(f"plain takes no {what}"), reason
        assert reason.feature == feature, reason
    # thd passes cu_seqlens as its layout's own argument, not as padding lengths
    thd = AttnCase("thd_thd_thd", "fp32", "padding", "cpu")
    assert plain.declines(thd) == []
    assert ADAPTERS["te_fast"].declines(cases[("alibi_slopes", "alibi")]) == []


def _installed_non_editable() -> str | None:
    """Why the installed-package test cannot run here (None when it can)."""
    try:
        dist = importlib.metadata.distribution("te-conformance")
    except importlib.metadata.PackageNotFoundError:
        return "te-conformance is not installed"
    direct = dist.read_text("direct_url.json")
    if direct and json.loads(direct).get("dir_info", {}).get("editable"):
        return "te-conformance is installed editable (pip install -e): its suites are the checkout"
    if Path(suites.__file__).resolve().is_relative_to(ROOT):
        return "the suites import from the checkout, not from the installed package"
    return None


@pytest.mark.slow
@pytest.mark.skipif(_installed_non_editable() is not None, reason=str(_installed_non_editable()))
def test_installed_package_runs_the_suites_from_anywhere(tmp_path):
    """`pip install .` (not -e) then `pytest --pyargs te_conformance.suites` from outside the
    checkout: the wheel carries the suites, the plugin and everything they import."""
    (tmp_path / "conftest.py").write_text("")  # nothing of the checkout's
    result = _pytest(
        ["-q", "--pyargs", "te_conformance.suites.conformance.test_attention",
         "te_conformance.suites.conformance.test_dropout", "-m", "not gpu",
         "-k", "test_core and bshd_bshd_bshd-fp32 or test_dropout_zero_is_identity"],
        tmp_path, {k: v for k, v in _child_env().items() if k != "PYTHONPATH"},
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert " passed" in out and " failed" not in out, out[-3000:]
