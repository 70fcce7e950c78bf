"""tools/te_kernels/build.py on a stand-in TE tree, and the adapter's limits (no GPU)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from te_conformance.suites.adapters import te_kernels

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ("scaled_masked_softmax", "scaled_upper_triang_masked_softmax")


def _build_module():
    spec = importlib.util.spec_from_file_location("te_build", ROOT / "tools/te_kernels/build.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["te_build"] = mod
    spec.loader.exec_module(mod)
    return mod


build = _build_module()

TEMPLATE = (
    'static constexpr char @STRING_NAME@[]\n  = R"__STRING_DELIM__(@STRING@)__STRING_DELIM__";\n'
)
# a kernel file as TE lays its includes out: the quoted ones resolve beside it, first
KERNEL = """#include "../common.h"
#include "../util/logging.h"
#include "../util/rtc.h"
#include "string_code_fused_softmax_{name}_cu.h"
__global__ void {name}_kernel(float *y) {{ y[threadIdx.x] = TE_COMMON_H; }}
int {name}_source_chars() {{ return sizeof(string_code_fused_softmax_{name}_cu); }}
bool {name}_rtc() {{ return transformer_engine::rtc::is_enabled(); }}
"""


def fake_te_tree(root: Path) -> Path:
    """A tree with TE's layout and trivial files; TE's logging.h and rtc.h refuse to compile, so
    a kernel that builds has included the project's stand-ins."""
    common = root / build.COMMON
    for rel in (*build.TE_UNITS, *build.TE_REQUIRED):
        (common.parent.parent / rel).parent.mkdir(parents=True, exist_ok=True)
        (common.parent.parent / rel).write_text("// fake\n")
    (common / "common.h").write_text("#pragma once\n#define TE_COMMON_H 1.0f\n")
    (common / "util/string_header.h.in").write_text(TEMPLATE)
    (common / "util/string.h").write_text(  # the stand-in logging.h builds its texts with it
        "#pragma once\n#include <string>\nnamespace transformer_engine {\n"
        "template <typename... Ts> std::string concat_strings(const Ts &...) { return {}; }\n}\n"
    )
    for name in ("logging.h", "rtc.h"):
        (common / "util" / name).write_text('#error "TE\'s own header, not the stand-in"\n')
    (common / "fused_softmax").mkdir()
    for name in SOFTMAX:
        (common / "fused_softmax" / f"{name}.cu").write_text(KERNEL.format(name=name))
    return root


def test_te_src_unset_names_the_fix(monkeypatch):
    monkeypatch.delenv("TE_SRC", raising=False)
    with pytest.raises(build.BuildError, match="TE_SRC is not set.*build.py export"):
        build.te_src_from(None)


def test_te_src_incomplete_lists_what_is_missing(tmp_path):
    src = fake_te_tree(tmp_path / "te")
    (src / build.COMMON / "common.cu").unlink()
    shutil.rmtree(src / build.COMMON / "fused_softmax")
    with pytest.raises(build.BuildError, match=r"missing .*common\.cu.*fused_softmax/\*\.cu"):
        build.te_src_from(str(src))


def test_te_src_from_environment(tmp_path, monkeypatch):
    src = fake_te_tree(tmp_path / "te")
    monkeypatch.setenv("TE_SRC", str(src))
    assert build.te_src_from(None) == src.resolve()


def test_stage_lays_standins_over_te_and_writes_string_headers(tmp_path):
    src = fake_te_tree(tmp_path / "te")
    out = tmp_path / "out"
    staged = build.stage(src, out)
    for mine, theirs in build.STANDINS.items():
        assert (staged / theirs).read_text() == (build.HERE / "standin" / mine).read_text()
    # TE's own files are copied byte for byte; TE_SRC is left as it was
    cu = "fused_softmax/scaled_masked_softmax.cu"
    assert (staged / build.COMMON / cu).read_bytes() == (src / build.COMMON / cu).read_bytes()
    assert "#error" in (src / build.COMMON / "util/logging.h").read_text()
    header = out / "string_headers/string_code_fused_softmax_scaled_masked_softmax_cu.h"
    text = header.read_text()
    assert text.startswith("static constexpr char string_code_fused_softmax_scaled_masked")
    assert KERNEL.format(name="scaled_masked_softmax") in text


def test_plan_flags(tmp_path):
    src = fake_te_tree(tmp_path / "te")
    out = tmp_path / "out"
    staged = build.stage(src, out)
    steps, link = build.plan(staged, out, arch="90", commit="abc123")
    by_name = {s.source.name: s for s in steps}
    assert set(by_name) == {
        *(f"{n}.cu" for n in SOFTMAX), "common.cu", "transformer_engine.cpp", "cuda_driver.cpp",
        "binding.cpp", "cuda_runtime_standin.cpp",
    }  # fmt: skip
    for name, step in by_name.items():
        assert step.argv[:4] == ["nvcc", "-std=c++17", "-ccbin", "/usr/bin/g++"]
        assert "-DNVTE_BUILD_LEGACY_STATIC_FUSED_SOFTMAX=1" in step.argv
        assert ("--use_fast_math" in step.argv) == name.startswith("scaled_")
        assert ("-gencode=arch=compute_90,code=sm_90" in step.argv) == name.endswith(".cu")
        assert step.output.parent == out / "obj"
    assert '-DTE_KERNELS_TE_COMMIT="abc123"' in by_name["binding.cpp"].argv
    assert len({s.output for s in steps}) == len(steps)
    assert link[link.index("-o") + 1] == str(out / build.LIB_NAME)
    assert "-z,defs" in link and all(str(s.output) in link for s in steps)


def test_dry_run_prints_every_call(tmp_path, capsys):
    src = fake_te_tree(tmp_path / "te")
    rc = build.main(["build", "--te-src", str(src), "--out", str(tmp_path / "o"), "--dry-run"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SOFTMAX) + 3 + 2 + 1 and "-shared" in lines[-1]


def test_missing_te_src_exits_2(tmp_path, capsys):
    assert build.main(["build", "--te-src", str(tmp_path / "nowhere")]) == 2
    assert "is not a TE source tree" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_fake_kernels_compile_with_the_standins(tmp_path):
    """The planned nvcc calls on the stand-in tree's kernels: they compile only if the quoted
    "../util/logging.h" and "../util/rtc.h" resolve to the project's stand-ins."""
    src = fake_te_tree(tmp_path / "te")
    out = tmp_path / "out"
    steps, _ = build.plan(build.stage(src, out), out)
    kernels = [s for s in steps if s.source.name.startswith("scaled_")]
    build.run(kernels, [sys.executable, "-c", "pass", "-o", "x"], jobs=2, log=lambda _: None)
    assert all(s.output.stat().st_size > 0 for s in kernels)


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_export_writes_the_tree_and_its_commit(tmp_path):
    src = fake_te_tree(tmp_path / "te")
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "fake TE"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    dest = tmp_path / ".te_src"
    rc = build.main(["export", str(src / ".git"), "--commit", "HEAD", "--dest", str(dest)])
    assert rc == 0
    assert (dest / "TE_COMMIT").read_text().strip() == sha.strip()
    assert build.te_src_from(str(dest)) == dest.resolve()
    assert build.te_commit(dest) == sha.strip()


# ----------------------------------------------------------------------------- the adapter's limits


def test_unbuilt_library_is_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("TE_KERNELS_LIB", str(tmp_path / "libte_kernels.so"))
    te_kernels._load.cache_clear()
    try:
        lib, why = te_kernels._load()
        assert lib is None and "not built" in why and "tools/te_kernels/build.py" in why
        if not torch.cuda.is_available():
            assert "no CUDA device" in te_kernels.unavailable_reason()
    finally:
        te_kernels._load.cache_clear()


@pytest.mark.parametrize(
    "sk, rows", [(1, 256), (8, 32), (16, 16), (32, 8), (33, 8), (128, 8), (129, 4), (16384, 4)]
)
def test_batches_per_block(sk, rows):
    assert te_kernels.batches_per_block(sk) == rows


F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    "op, shape, dtype, mask, backward, expected",
    [
        ("scaled_softmax", (1, 3, 8, 64), F16, None, False, []),
        ("scaled_softmax", (1, 3, 8, 64), F32, None, False, ["Only fp16 and bf16"]),
        ("scaled_softmax", (1, 3, 8, 16392), BF16, None, False, ["16384 or less"]),
        ("scaled_softmax", (1, 3, 8, 17), BF16, None, False, ["divisible by 8"]),
        ("scaled_softmax", (1, 3, 12, 64), BF16, None, False, ["Unsupported shape"]),
        ("scaled_softmax", (1, 3, 5, 64), BF16, None, False, ["Unsupported shape"]),
        ("scaled_softmax", (1, 3, 1, 64), BF16, None, False, ["greater than 1", "Unsupported"]),
        ("scaled_softmax", (1, 3, 5, 17), BF16, None, True, []),
        ("scaled_softmax", (3, 8, 64), BF16, None, False, ["expected 4D"]),
        ("scaled_masked_softmax", (2, 3, 8, 64), F16, (2, 1, 8, 64), False, []),
        ("scaled_masked_softmax", (2, 3, 8, 64), F16, (1, 1, 8, 64), False, []),
        ("scaled_masked_softmax", (2, 3, 8, 64), F16, (3, 1, 8, 64), False, ["mask of shape"]),
        ("scaled_masked_softmax", (2, 3, 8, 64), F16, (2, 3, 8, 64), False, ["mask of shape"]),
        ("scaled_upper_triang_masked_softmax", (8, 64, 64), F16, None, False, []),
        ("scaled_upper_triang_masked_softmax", (32, 5, 64), F16, None, False, ["sq == sk"]),
        ("scaled_upper_triang_masked_softmax", (3, 64, 64), F16, None, False, ["attn_batches"]),
        ("scaled_aligned_causal_masked_softmax", (1, 3, 5, 64), F16, None, False, []),
        ("scaled_aligned_causal_masked_softmax", (1, 3, 5, 60), F16, None, False, ["by 8"]),
    ],
)
def test_not_supported_reasons(op, shape, dtype, mask, backward, expected):
    reasons = te_kernels.not_supported_reasons(op, shape, dtype, mask, backward)
    assert len(reasons) == len(expected), reasons
    for reason, want in zip(reasons, expected):
        assert want in reason and reason.startswith("TE ")


@pytest.mark.parametrize("s, faults", [(64, False), (63, False), (1023, True), (1024, False)])
def test_fault_reasons_upper_triang_rows_of_odd_stride(s, faults):
    op = "scaled_upper_triang_masked_softmax"
    assert bool(te_kernels.fault_reasons(op, (4, s, s))) == faults
    assert not te_kernels.fault_reasons("scaled_softmax", (1, 1, 8, s))
