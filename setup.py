"""Builds te_fast._C ahead of time: CPU kernels always, CUDA kernels when torch and nvcc allow."""

import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _want_cuda() -> bool:
    flag = os.environ.get("TE_FAST_CUDA")
    if flag == "0":
        return False
    if os.environ.get("TE_FAST_FORCE_CUDA") == "1":
        return True
    # A CUDA build of torch plus a toolkit is enough: no GPU is needed to build.
    import torch

    return bool(torch.version.cuda) and cpp_extension.CUDA_HOME is not None


def _default_arch_list() -> None:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return  # honoured as given
    arch = "9.0"
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            arch = f"{major}.{minor}"
    except Exception:  # no driver: keep the default
        pass
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch


def get_extensions():
    """One extension, te_fast._C; the CUDA sources join when a CUDA build is possible."""
    sources = [os.path.join("csrc", "te_fast.cpp"), os.path.join("csrc", "eager.cpp")]
    # No -std here: BuildExtension picks the standard the installed torch was built with
    # (C++17 for torch 2.11, C++20 for 2.13); overriding it breaks exceptions thrown by
    # TORCH_CHECK on some toolchains. TE_FAST_CXXFLAGS adds flags for experiments. No
    # floating-point contraction: with -march flags that enable FMA, gcc would fuse
    # x * scale - m (rules.h, exp_shifted says why that must not happen).
    cxx = ["-O3", "-ffp-contract=off"] + os.environ.get("TE_FAST_CXXFLAGS", "").split()
    extra = {"cxx": cxx}
    use_cuda = _want_cuda()
    if use_cuda:
        _default_arch_list()
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cpp")))
        sources += sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")))
        extra["nvcc"] = ["-O3", "-lineinfo"]
        ext = cpp_extension.CUDAExtension
    else:
        ext = cpp_extension.CppExtension
    return [
        ext(
            name="te_fast._C",
            sources=sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args=extra,
            define_macros=[("TE_FAST_WITH_CUDA", "1" if use_cuda else "0")],
        )
    ]


def get_packages() -> tuple[list[str], dict[str, str]]:
    """(packages, package_dir): te_ref and te_fast under their own names; the checkout's suites/
    and reports/ as te_conformance.suites and te_conformance.reports, names that cannot collide
    with another project's (te_conformance/__init__.py)."""
    packages = find_packages(include=["te_ref", "te_ref.*", "te_fast", "te_fast.*"])
    packages.append("te_conformance")
    folders = {"suites": "te_conformance.suites", "reports": "te_conformance.reports"}
    for folder, name in folders.items():
        found = find_packages(include=[folder, folder + ".*"])
        packages += [name + p[len(folder):] for p in found]
    return packages, {name: folder for folder, name in folders.items()}


PACKAGES, PACKAGE_DIR = get_packages()

setup(
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    ext_modules=get_extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
