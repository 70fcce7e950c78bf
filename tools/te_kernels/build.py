"""Build Transformer Engine's fused softmax kernels, from TE's own unmodified sources, as a peer.

  python tools/te_kernels/build.py export GIT_DIR [--commit REV] [--dest .te_src]
  TE_SRC=.te_src python tools/te_kernels/build.py build [--out build/te_kernels] [--arch 90]

`export` writes TE's source tree (`git archive` of REV: transformer_engine/common and the
PyTorch softmax binding it mirrors) into an ignored folder, with the commit in TE_COMMIT.
`build` copies that tree into the out-of-tree build folder, lays the project's stand-ins over the
few files that would drag in more than the kernels need (STANDINS; docs/te_kernels.md says why
each), generates TE's string headers from TE's own template, compiles TE's
fused_softmax/*.cu, common.cu, transformer_engine.cpp and util/cuda_driver.cpp with TE's flags
for the fused softmax sources, plus the project's binding.cpp and cuda_runtime_standin.cpp, and
links OUT/libte_kernels.so (every symbol resolved at link time); suites/adapters/te_kernels.py
loads it with ctypes. TE's code is never copied into the repository: TE_SRC and OUT are ignored
folders.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_OUT = ROOT / "build" / "te_kernels"
LIB_NAME = "libte_kernels.so"

COMMON = "transformer_engine/common"
# TE's files this build compiles (paths under TE_SRC); the fused softmax ones are globbed
TE_UNITS = (
    f"{COMMON}/common.cu",
    f"{COMMON}/transformer_engine.cpp",
    f"{COMMON}/util/cuda_driver.cpp",
)
SOFTMAX_GLOB = "fused_softmax/*.cu"
# TE's files that must exist besides the units (a tree without them is not TE's)
TE_REQUIRED = (
    f"{COMMON}/common.h",
    f"{COMMON}/utils.cuh",
    f"{COMMON}/util/string.h",
    f"{COMMON}/util/string_header.h.in",
    f"{COMMON}/include/transformer_engine/softmax.h",
    f"{COMMON}/include/transformer_engine/transformer_engine.h",
)
# project file (under tools/te_kernels/standin) -> the TE file it replaces in the staged tree
STANDINS = {
    "transformer_engine/common/util/logging.h": f"{COMMON}/util/logging.h",
    "transformer_engine/common/util/rtc.h": f"{COMMON}/util/rtc.h",
}
# the project's own translation units
PROJECT_UNITS = (HERE / "binding.cpp", HERE / "standin" / "cuda_runtime_standin.cpp")
# TE's CMakeLists.txt: -O3 --expt-relaxed-constexpr for all CUDA, --use_fast_math for the fused
# softmax sources; NVTE_BUILD_LEGACY_STATIC_FUSED_SOFTMAX=ON compiles the kernels ahead of time
DEFINES = ("NVTE_BUILD_LEGACY_STATIC_FUSED_SOFTMAX=1",)
CUDA_FLAGS = ("-O3", "--expt-relaxed-constexpr")
SOFTMAX_FLAGS = ("--use_fast_math",)


class BuildError(RuntimeError):
    """A build that cannot go on, with what to do about it."""


@dataclass
class Step:
    """One compiler call: its source, object and argv."""

    source: Path
    output: Path
    argv: list[str] = field(default_factory=list)


def te_src_from(value: str | None) -> Path:
    """TE_SRC (argument or environment) as a checked path to TE's source tree."""
    value = value or os.environ.get("TE_SRC")
    if not value:
        raise BuildError(
            "TE_SRC is not set: give the path of Transformer Engine's source tree "
            "(TE_SRC=... or --te-src; `build.py export` writes one into .te_src)"
        )
    src = Path(value).resolve()
    missing = [p for p in (*TE_UNITS, *TE_REQUIRED) if not (src / p).is_file()]
    if not sorted((src / COMMON).glob(SOFTMAX_GLOB)):
        missing.append(f"{COMMON}/{SOFTMAX_GLOB}")
    if missing:
        raise BuildError(f"TE_SRC={src} is not a TE source tree: missing {', '.join(missing)}")
    return src


def te_commit(src: Path) -> str:
    """The TE commit the tree came from: its TE_COMMIT file (export), else 'unknown'."""
    f = src / "TE_COMMIT"
    return f.read_text().strip() if f.is_file() else "unknown"


def string_header(template: str, name: str, text: str) -> str:
    """TE's CMake make_string_header_from_file: its template with the name and the file's text."""
    return template.replace("@STRING_NAME@", name).replace("@STRING@", text)


def stage(src: Path, out: Path) -> Path:
    """Copy TE's common tree into OUT/src, lay the stand-ins over it, write the string headers.

    Returns OUT/src. A quoted include ("../util/logging.h") is looked up beside the including
    file first, so stand-ins must replace files in a copy: an include path cannot shadow them.
    """
    staged = out / "src"
    if staged.exists():
        shutil.rmtree(staged)
    shutil.copytree(src / COMMON, staged / COMMON)
    for mine, theirs in STANDINS.items():
        shutil.copyfile(HERE / "standin" / mine, staged / theirs)
    gen = out / "string_headers"
    gen.mkdir(parents=True, exist_ok=True)
    template = (staged / COMMON / "util/string_header.h.in").read_text()
    for cu in sorted((staged / COMMON).glob(SOFTMAX_GLOB)):
        rel = cu.relative_to(staged / COMMON).as_posix()
        name = "string_code_" + rel.replace("/", "_").replace(".", "_")
        (gen / f"{name}.h").write_text(string_header(template, name, cu.read_text()))
    return staged


def plan(
    staged: Path,
    out: Path,
    *,
    nvcc: str = "nvcc",
    cxx: str = "/usr/bin/g++",
    arch: str = "90",
    commit: str = "unknown",
) -> tuple[list[Step], list[str]]:
    """The compile steps and the link argv for a staged tree."""
    objs = out / "obj"
    includes = [
        f"-I{staged / COMMON / 'include'}",
        f"-I{staged / COMMON}",
        f"-I{staged / 'transformer_engine'}",
        f"-I{staged}",
        f"-I{out / 'string_headers'}",
    ]
    base = [nvcc, "-std=c++17", "-ccbin", cxx, "-Xcompiler", "-fPIC", *CUDA_FLAGS, *includes]
    base += [f"-D{d}" for d in DEFINES]
    gencode = [f"-gencode=arch=compute_{arch},code=sm_{arch}"]
    softmax = sorted((staged / COMMON).glob(SOFTMAX_GLOB))
    sources = [*softmax, *(staged / u for u in TE_UNITS)]
    steps = []
    for source in [*sources, *PROJECT_UNITS]:
        stem = (
            source.relative_to(staged).as_posix()
            if source.is_relative_to(staged)
            else ("project/" + source.name)
        )
        output = objs / (stem.replace("/", "__") + ".o")
        argv = [*base]
        if source in softmax:
            argv += SOFTMAX_FLAGS
        if source.suffix == ".cu":
            argv += gencode
        if source.name == "binding.cpp":
            argv.append(f'-DTE_KERNELS_TE_COMMIT="{commit}"')
        argv += ["-c", str(source), "-o", str(output)]
        steps.append(Step(source, output, argv))
    link = [nvcc, "-shared", "-ccbin", cxx, "-cudart", "shared", *gencode]
    link += ["-o", str(out / LIB_NAME)]
    link += [str(s.output) for s in steps]
    link += ["-Xlinker", "-z,defs", "-ldl"]
    return steps, link


def run(steps: list[Step], link: list[str], jobs: int, log=print) -> None:
    """Compile (jobs at a time), then link; a failed call raises with its output."""

    def one(step: Step):
        step.output.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        p = subprocess.run(step.argv, capture_output=True, text=True)
        return step, p, time.monotonic() - t0

    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for step, p, dt in pool.map(one, steps):
            log(
                f"te_kernels: {step.source.name} {'ok' if p.returncode == 0 else 'FAILED'} "
                f"({dt:.0f} s)"
            )
            if p.returncode != 0:
                raise BuildError(f"compiling {step.source} failed:\n{p.stdout}{p.stderr}")
    p = subprocess.run(link, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"linking {link[link.index('-o') + 1]} failed:\n{p.stdout}{p.stderr}")


def build(args) -> Path:
    src = te_src_from(args.te_src)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    staged = stage(src, out)
    commit = te_commit(src)
    steps, link = plan(staged, out, nvcc=args.nvcc, cxx=args.cxx, arch=args.arch, commit=commit)
    if args.dry_run:
        for s in steps:
            print(" ".join(s.argv))
        print(" ".join(link))
        return out / LIB_NAME
    (out / LIB_NAME).unlink(missing_ok=True)
    run(steps, link, args.jobs)
    manifest = {
        "te_src": str(src),
        "te_commit": commit,
        "standins": {v: f"tools/te_kernels/standin/{k}" for k, v in STANDINS.items()},
        "project_units": [str(p.relative_to(ROOT)) for p in PROJECT_UNITS],
        "arch": args.arch,
        "cxx": args.cxx,
        "seconds": round(time.monotonic() - t0, 1),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"te_kernels: built {out / LIB_NAME} from TE {commit} in {manifest['seconds']} s")
    return out / LIB_NAME


def export(args) -> Path:
    """git archive of TE's tree at REV into DEST (replaced), with TE_COMMIT."""
    git = ["git", f"--git-dir={args.git_dir}"]
    commit = subprocess.run(
        [*git, "rev-parse", f"{args.commit}^{{commit}}"], capture_output=True, text=True
    )
    if commit.returncode != 0:
        raise BuildError(f"{args.commit} is not a commit of {args.git_dir}: {commit.stderr}")
    sha = commit.stdout.strip()
    dest = Path(args.dest).resolve()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    paths = [COMMON]
    for extra in ("transformer_engine/pytorch/csrc/extensions/softmax.cpp", "LICENSE"):
        if subprocess.run([*git, "cat-file", "-e", f"{sha}:{extra}"]).returncode == 0:
            paths.append(extra)  # what the adapter mirrors, and TE's licence
    archive = subprocess.run([*git, "archive", sha, *paths], capture_output=True)
    if archive.returncode != 0:
        raise BuildError(f"git archive failed: {archive.stderr.decode()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    (dest / "TE_COMMIT").write_text(sha + "\n")
    print(f"te_kernels: TE {sha} exported into {dest}")
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile TE_SRC's fused softmax into OUT/libte_kernels.so")
    b.add_argument("--te-src", help="TE's source tree (default: $TE_SRC)")
    b.add_argument("--out", default=str(DEFAULT_OUT))
    b.add_argument("--arch", default=os.environ.get("TE_KERNELS_ARCH", "90"))
    b.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    b.add_argument("--cxx", default="/usr/bin/g++", help="host compiler (nvcc -ccbin)")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    b.add_argument("--dry-run", action="store_true", help="print the compiler calls only")
    e = sub.add_parser("export", help="write TE's sources at a commit into an ignored folder")
    e.add_argument("git_dir", help="a clone or bare mirror of NVIDIA/TransformerEngine")
    e.add_argument("--commit", default="HEAD")
    e.add_argument("--dest", default=str(ROOT / ".te_src"))
    args = parser.parse_args(argv)
    try:
        (build if args.cmd == "build" else export)(args)
    except BuildError as err:
        print(f"te_kernels: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
