"""tools/same_sass.py: a kernel refactor proven to compile to the same SASS, without a GPU.

The comparison on canned nvdisasm text (label renumbering, the kernels named), then the real thing
on one source with nvcc and nvdisasm: an unchanged copy and a comment-only edit are the same machine
code, a changed constant is not, and the kernels it touches are named; a base that does not compile
cannot be compared (exit 2). The real runs skip where nvcc or nvdisasm is absent, but not under the
project's own CI, TE_CONFORMANCE_CI=1 (.ci/run sets it and installs nvdisasm): CI=true alone, as
GitHub and GitLab set it, does not require them."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import same_sass  # noqa: E402

K1 = "_ZN15te_fast_kernels14softmax_detail16softmax_fwd_rowsIfLi4ELi2ELi16ELi1ELb1ELi1536EEEvNS_14SoftmaxFwdArgsE"  # noqa: E501
K2 = "_ZN15te_fast_kernels14softmax_detail16softmax_bwd_rowsIfLi4ELi2ELi16ELi1ELb0EEEvNS_14SoftmaxBwdArgsE"  # noqa: E501


def sass(first_label: int, k1_op: str = "FADD R2, R2, R3", k2_op: str = "FMUL R4, R4, R5") -> str:
    """nvdisasm-like text of two kernels; local labels numbered from first_label."""
    a, b = first_label, first_label + 1

    def kernel(name: str, label: int, op: str) -> str:
        return (
            f"//--------------------- .text.{name} --------------------------\n"
            f'\t.section\t.text.{name},"ax",@progbits\n'
            f"        .size           {name},(.L_x_{label} - {name})\n"
            f"        /*0000*/                   {op} ;\n"
            f"        /*0010*/               @P0 BRA `(.L_x_{label}) ;\n"
            f".L_x_{label}:\n"
            f"        /*0020*/                   EXIT ;\n"
        )

    info = '\t.section\t.nv.info,"",@"SHT_CUDA_INFO"\n'
    return info + kernel(K1, a, k1_op) + kernel(K2, b, k2_op)


def test_labels_do_not_count():
    assert same_sass.compare(sass(0), sass(40)) == []


def test_helper_numbers_do_not_count():
    """nvcc numbers its out-of-line helpers across a file, as the assembler numbers labels: a
    kernel added before this one renumbers them (seen on 2026-12-05: 10 fp32 kernels called
    changed that were the same)."""

    def helpers(n: int, second: str = "sm3x_div_rn_noftz_f32_slowpath") -> str:
        rcp, div = f"$__internal_{n}_$__cuda_sm20_dblrcp_rn_slowpath_v3", f"$__internal_{n + 1}_$"
        return sass(
            0, k1_op=f"CALL.REL.NOINC `({rcp}) ;\n        CALL.REL.NOINC `({div}__cuda_{second})"
        )

    assert same_sass.compare(helpers(37), helpers(44)) == []
    # but two helpers are still told apart, and a call to another one is a change
    assert same_sass.compare(helpers(37), helpers(44, second="sm20_div_rn_f64_full")) == [K1]


def test_anonymous_namespace_paths_do_not_count():
    """nvcc hashes the source's path into an anonymous namespace's name: the base's copy of
    convert.cu, compiled from a temporary folder, named every kernel differently."""
    anon = "_ZN15te_fast_kernels43_GLOBAL__N__{}_10_convert_cu_de701f7918bshd_to_thd_kernelIhEEvv"

    def one(h: str, op: str = "FADD R2, R2, R3") -> str:
        return sass(0, k1_op=op).replace(K1, anon.format(h))

    assert same_sass.compare(one("6f9fbfd4"), one("4c93fc6a")) == []
    assert same_sass.compare(one("6f9fbfd4"), one("4c93fc6a", "FADD R2, R3, R2")) == [
        anon.format("00000000")
    ]


def test_a_changed_kernel_is_named_alone():
    assert same_sass.compare(sass(0), sass(7, k2_op="FFMA R4, R4, R5, R6")) == [K2]
    assert same_sass.compare(sass(0), sass(0, k1_op="FADD R2, R3, R2")) == [K1]


def test_a_kernel_on_one_side_and_other_sections():
    only_k1 = sass(0).split("//---------------------")
    one = "//---------------------".join(only_k1[:2])  # the header and K1 alone
    assert same_sass.compare(one, sass(0)) == [f"{K2} (only after)"]
    other = sass(0).replace("SHT_CUDA_INFO", "SHT_CUDA_INFO_X")
    assert same_sass.compare(sass(0), other) == ["(other sections: constants, attributes)"]


def _ci() -> bool:
    return os.environ.get("TE_CONFORMANCE_CI", "").strip().lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def tools_found():
    nvcc = os.environ.get("NVCC", "nvcc")
    nvdisasm = same_sass.find_nvdisasm(None)
    if shutil.which(nvcc) is None or nvdisasm is None:
        reason = f"nvcc ({nvcc}) or nvdisasm not found"
        if _ci():
            pytest.fail(
                f"{reason}; TE_CONFORMANCE_CI=1: CI must run it (.ci/run installs "
                "nvidia-cuda-nvdisasm)"
            )
        pytest.skip(reason)
    return ["--nvcc", nvcc, "--nvdisasm", nvdisasm]


FILE = "softmax_fwd_fp32.cu"
SHIFT = "static_cast<double>(kx * wide_key(scale)) * scale;"


@pytest.mark.parametrize(
    "edit,rc",
    [
        (None, 0),
        (lambda s: s.replace(SHIFT, SHIFT + "  // a comment changes nothing"), 0),
        (lambda s: s.replace(SHIFT, SHIFT[:-1] + " * 1.0000001;"), 1),
    ],
    ids=["unchanged", "comment", "constant"],
)
def test_real_sass(tmp_path, capsys, tools_found, edit, rc):
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    impl = tmp_path / "csrc" / "cuda" / "softmax" / "common.cuh"  # wide_shift
    if edit is not None:
        text = impl.read_text()
        assert SHIFT in text  # the edit must land, or the case proves nothing
        impl.write_text(edit(text))
    args = ["--base-dir", str(tmp_path), "--files", FILE, *tools_found]
    assert same_sass.main(args) == rc
    out = capsys.readouterr().out
    if rc == 0:
        assert f"{FILE}: same machine code" in out
    else:
        assert f"{FILE}: DIFFERS from {tmp_path}" in out
        assert "softmax_fwd_rows<float, 4, 2, 16, 1, true, 1536>" in out  # a direct fp32 kernel


def test_a_compile_error_cannot_compare(tmp_path, capsys, tools_found):
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    with open(tmp_path / "csrc" / "cuda" / FILE, "a") as f:
        f.write("\n#error the base does not compile\n")
    assert same_sass.main(["--base-dir", str(tmp_path), "--files", FILE, *tools_found]) == 2
    err = capsys.readouterr().err
    assert f"same_sass: nvcc failed on {tmp_path / 'csrc' / 'cuda' / FILE}" in err
