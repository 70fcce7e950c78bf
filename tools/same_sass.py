"""Whether a CUDA change leaves the kernels' machine code as it was: SASS before and after.

    python tools/same_sass.py                         the tree's csrc/cuda against HEAD's
    python tools/same_sass.py --base REV              ... against another revision's
    python tools/same_sass.py --base-dir DIR          ... against DIR/csrc (a folder, as gpu_ab.sh)
    python tools/same_sass.py --files softmax_fwd_fp32.cu,softmax.cu    only these sources

Compiles each csrc/cuda/*.cu of both sides for sm_90 (kernel_resources.py's flags, without
-lineinfo and ptxas's report), disassembles the cubins with nvdisasm and compares them, kernel by
kernel. No GPU is needed. A refactor of the kernel source (a renamed variable, a hoisted helper, a
comment) that compiles to the same SASS runs the same instructions on the same data: the same
bits and the same speed, proven without a GPU. A change that is meant to alter the code is what
tools/gpu/ab.sh measures.

It compares device code only: a change to the host side of a .cu (which kernel a launcher picks,
the grid it sizes) is not seen, and needs tools/gpu/softmax_bits.py and the benchmark on a GPU.

The comparison is of the whole disassembly, with the assembler's local labels (.L_x_N) and
nvcc's out-of-line helpers ($__internal_N_$..., a double division's slow path), both numbered
across a file, renumbered in their order of appearance, so that a kernel's code does not depend
on the kernels before it; the kernels that differ are named. A kernel in an anonymous namespace
(convert.cu's) has a name with a hash of the source's path in it (_GLOBAL__N__6f9fbfd4_...), which
differs between the base's copy and the tree's: the hash is set to zeros on both sides.

nvdisasm is taken from --nvdisasm, $NVDISASM, PATH, or the `nvidia-cuda-nvdisasm` wheel
(pip install nvidia-cuda-nvdisasm: nvidia/cu13/bin/nvdisasm in site-packages).

Exit: 0 the same machine code; 1 some differ (named); 2 cannot run (no nvcc or nvdisasm, a
compile error, a bad argument).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_resources import FLAGS, ROOT, demangle  # noqa: E402

SASS_FLAGS = tuple(f for f in FLAGS if f not in ("-lineinfo", "-Xptxas", "-v"))
_LABEL = re.compile(r"\.L_x_\d+")
# nvcc's out-of-line helpers (a double reciprocal's slow path, ...), numbered across the file like
# the labels: $__internal_37_$__cuda_sm20_dblrcp_rn_slowpath_v3.
_INTERNAL = re.compile(r"\$__internal_\d+_\$")
_FUNCTION = re.compile(r"^//-+ \.text\.(\S+) -+$", re.M)
# An anonymous namespace's mangled name: nvcc puts a hash of the source file's path in it.
_ANONYMOUS = re.compile(r"_GLOBAL__N__[0-9a-f]{8}_")


def pathless(sass: str) -> str:
    """The disassembly with the path hash of anonymous namespaces set to zeros (its length, and
    so the mangled name's, kept)."""
    return _ANONYMOUS.sub("_GLOBAL__N__00000000_", sass)


def normalize(sass: str) -> str:
    """The disassembly with its local labels and nvcc's internal helpers renumbered in order of
    appearance."""
    labels: dict[str, str] = {}
    helpers: dict[str, str] = {}
    sass = _LABEL.sub(lambda m: labels.setdefault(m[0], f".L_{len(labels)}"), sass)
    return _INTERNAL.sub(lambda m: helpers.setdefault(m[0], f"$__internal_{len(helpers)}_$"), sass)


def functions(sass: str) -> dict[str, str]:
    """{mangled name: its normalized code} of each .text section of nvdisasm's output."""
    sass = pathless(sass)
    heads = list(_FUNCTION.finditer(sass))
    out = {}
    for h, nxt in zip(heads, heads[1:] + [None]):
        out[h[1]] = normalize(sass[h.end() : nxt.start() if nxt else len(sass)])
    return out


def compare(base: str, new: str) -> list[str]:
    """What differs between two disassemblies of one source: the kernels whose code differs,
    those on one side only, and '(other sections)' when the rest of the file differs alone."""
    base, new = pathless(base), pathless(new)
    if normalize(base) == normalize(new):
        return []
    fb, fn = functions(base), functions(new)
    names = sorted(set(fb) | set(fn))
    diff = [
        n if n in fb and n in fn else f"{n} (only {'before' if n in fb else 'after'})"
        for n in names
        if fb.get(n) != fn.get(n)
    ]
    return diff or ["(other sections: constants, attributes)"]


def find_nvdisasm(given: str | None) -> str | None:
    if given:
        return given if shutil.which(given) else None
    for cand in (os.environ.get("NVDISASM"), "nvdisasm"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    wheel = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13" / "bin" / "nvdisasm"
    return str(wheel) if wheel.is_file() else None


class ToolFailed(Exception):
    """nvcc or nvdisasm failed (its output is on stderr)."""


def disassemble(nvcc: str, nvdisasm: str, csrc: Path, src: str, tmp: Path) -> str:
    """SASS of csrc/cuda/SRC; ToolFailed when nvcc or nvdisasm fails."""
    cubin = tmp / (src.replace("/", "_") + ".cubin")
    cmd = [nvcc, *SASS_FLAGS, f"-I{csrc}", "-cubin", str(csrc / "cuda" / src), "-o", str(cubin)]
    for tool, run in (("nvcc", cmd), ("nvdisasm", [nvdisasm, str(cubin)])):
        done = subprocess.run(run, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise ToolFailed(f"same_sass: {tool} failed on {csrc / 'cuda' / src}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    side = p.add_mutually_exclusive_group()
    side.add_argument("--base", default="HEAD", help="git revision to compare with (HEAD)")
    side.add_argument("--base-dir", type=Path, help="a folder holding the base's csrc/")
    p.add_argument("--files", help="comma-separated csrc/cuda sources (default: every *.cu)")
    p.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    p.add_argument("--nvdisasm")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    if shutil.which(args.nvcc) is None:
        print(f"same_sass: {args.nvcc} not found (set NVCC or --nvcc)", file=sys.stderr)
        return 2
    nvdisasm = find_nvdisasm(args.nvdisasm)
    if nvdisasm is None:
        print("same_sass: nvdisasm not found (--nvdisasm, NVDISASM, or pip install "
              "nvidia-cuda-nvdisasm)", file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.base_dir is not None:
            base = args.base_dir.resolve() / "csrc"
            if not (base / "cuda").is_dir():
                print(f"same_sass: {base}/cuda is not a folder", file=sys.stderr)
                return 2
        else:
            base = tmp / "base" / "csrc"
            base.parent.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.base, "csrc"], capture_output=True
            )
            if archive.returncode != 0:
                sys.stderr.write(archive.stderr.decode())
                print(f"same_sass: cannot read csrc/ at {args.base}", file=sys.stderr)
                return 2
            subprocess.run(["tar", "-x", "-C", str(base.parent)], input=archive.stdout, check=True)
        new = ROOT / "csrc"
        if args.files:
            sources = [f.strip() for f in args.files.split(",") if f.strip()]
        else:
            sources = sorted({q.name for d in (base, new) for q in (d / "cuda").glob("*.cu")})
        for src in sources:
            if not (new / "cuda" / src).is_file() and not (base / "cuda" / src).is_file():
                print(f"same_sass: no csrc/cuda/{src} on either side", file=sys.stderr)
                return 2
        jobs = [(side, src) for src in sources for side in ("base", "new")]

        def one(job: tuple[str, str]) -> str | None:
            side, src = job
            root = base if side == "base" else new
            if not (root / "cuda" / src).is_file():
                return None
            (tmp / side).mkdir(exist_ok=True)
            return disassemble(args.nvcc, nvdisasm, root, src, tmp / side)

        try:
            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                sass = dict(zip(jobs, pool.map(one, jobs)))
        except ToolFailed as failed:
            print(failed, file=sys.stderr)
            return 2
    what = args.base_dir or args.base
    differ = 0
    for src in sources:
        b, n = sass[("base", src)], sass[("new", src)]
        if b is None or n is None:
            print(f"{src}: only {'after' if b is None else 'before'} ({what})")
            differ += 1
            continue
        diff = compare(b, n)
        kernels = len(functions(n))
        if not diff:
            what_same = f"{kernels} kernels" if kernels else "no kernels: host code not compared"
            print(f"{src}: same machine code ({what_same})")
            continue
        differ += 1
        print(f"{src}: DIFFERS from {what} in {len(diff)} of {kernels} kernels")
        named = demangle([d.split(" ")[0] for d in diff])
        for d in diff:
            name, _, rest = d.partition(" ")
            print(f"  {named.get(name, name)} {rest}".rstrip())
    print(f"same_sass: {len(sources) - differ} of {len(sources)} sources compile to the same SASS")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
