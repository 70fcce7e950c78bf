"""Bitwise A/B of two te_fast builds: save every softmax op's outputs on a fixed input matrix,
then compare two saved files bit for bit.

    python tools/gpu/softmax_bits.py save A.json [--device cuda] [--quick]  (build A importable)
    python tools/gpu/softmax_bits.py save B.json [--device cuda] [--quick]  (build B importable)
    python tools/gpu/softmax_bits.py compare A.json B.json

For a kernel change meant to keep every result (a new reduction protocol, a branch made a
select, a refactor), this says whether it did, on far more shapes than the suites' tolerance
checks: the four forward ops and their backward ops in fp16, bf16 and fp32, rows of 32 to 65537
columns (every kernel family: short rows, the direct and long forwards, clusters, the two-pass
kernels; --quick keeps a few short rows), both signs of the scale (the general path), explicit
masks with a fully masked row, -inf scores, and a misaligned odd-length view (one-element
accesses). The inputs come from a seeded generator on the device, so both builds see the same
bits.

save writes each output's shape, dtype and SHA-256 of its bytes (JSON, ~80 KB: the full
matrix's outputs are ~3.7 GB, which once filled a GPU machine's disk three builds at a time);
--tensors saves the outputs themselves instead (torch.save), so that compare can also count the
bytes that differ. compare takes either kind of file (hashing a tensor file's outputs) and exits
0 when every output is bitwise equal, 1 when some differ (it names them), 2 when the two files
do not hold the same outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator

import torch

from te_conformance.suites.cases import DTYPES

LENGTHS = (32, 100, 128, 1000, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 65537)
QUICK_LENGTHS = (32, 100, 1000)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def outputs(device: str, quick: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, output) over the matrix (see the module docstring), each on the CPU."""
    import te_fast

    ops = te_fast.ops
    gen = torch.Generator(device=device).manual_seed(0)
    budget = (1 << 16) if quick else (64 << 20)  # elements of x per case (16-bit)
    for dname, dtype in DTYPES.items():
        for sk in QUICK_LENGTHS if quick else LENGTHS:
            per = budget // (2 if dtype == torch.float32 else 1)
            sq = 8 if quick else 64
            b = max(1, min(4096, per // sk) // sq)
            x = (torch.randn(b, 2, sq // 2, sk, device=device, generator=gen) * 4).to(dtype)
            x.view(-1)[::997] = float("-inf")
            dy = torch.randn(x.shape, device=device, generator=gen).to(dtype)
            mask = torch.rand(b, 1, sq // 2, sk, device=device, generator=gen) < 0.3
            mask[0, 0, 0] = True  # one fully masked row
            out: dict[str, torch.Tensor] = {}  # this (dtype, sk)'s outputs
            for scale in (0.125, -0.5):
                key = f"{dname}-sk{sk}-scale{scale}"
                y = ops.scaled_softmax(x, scale)
                out[f"scaled_softmax-{key}"] = y
                out[f"scaled_softmax_bwd-{key}"] = ops.scaled_softmax_bwd(dy, y, scale)
                y = ops.scaled_masked_softmax(x, mask, scale)
                out[f"scaled_masked_softmax-{key}"] = y
                out[f"scaled_masked_softmax_bwd-{key}"] = ops.scaled_masked_softmax_bwd(
                    dy, y, scale
                )
                y = ops.scaled_aligned_causal_masked_softmax(x, scale)
                out[f"scaled_aligned_causal_masked_softmax-{key}"] = y
                out[f"scaled_aligned_causal_masked_softmax_bwd-{key}"] = (
                    ops.scaled_aligned_causal_masked_softmax_bwd(dy, y, scale)
                )
                if sk <= 4096:  # square [attn_batches, sk, sk]
                    x3 = (torch.randn(2 if quick else 8, sk, sk, device=device, generator=gen)
                          * 4).to(dtype)  # fmt: skip
                    dy3 = torch.randn(x3.shape, device=device, generator=gen).to(dtype)
                    y = ops.scaled_upper_triang_masked_softmax(x3, scale)
                    out[f"scaled_upper_triang_masked_softmax-{key}"] = y
                    out[f"scaled_upper_triang_masked_softmax_bwd-{key}"] = (
                        ops.scaled_upper_triang_masked_softmax_bwd(dy3, y, scale)
                    )
            # A view one element in (misaligned) of sk - 1 columns: the one-element kernels.
            flat = x.view(-1)[1 : 1 + x.numel() - sk].view(-1, sk)[:, : sk - 1].contiguous()
            out[f"scaled_softmax-{dname}-sk{sk - 1}-odd"] = ops.scaled_softmax(
                flat.view(1, 1, *flat.shape), 0.3
            )
            for name, t in out.items():
                yield name, t.cpu()


def digest(t: torch.Tensor) -> list:
    """[shape, dtype, SHA-256 of the bytes] of one output."""
    sha = hashlib.sha256(_bits(t).numpy()).hexdigest()  # the array's buffer, not a copy
    return [list(t.shape), str(t.dtype).replace("torch.", ""), sha]


def load(path: str) -> dict:
    """{name: tensor} from a --tensors file, or {name: [shape, dtype, sha256]} from a JSON one."""
    try:
        with open(path) as f:
            return json.load(f)["outputs"]
    except (UnicodeDecodeError, json.JSONDecodeError):
        return torch.load(path)


def compare(a: dict, b: dict) -> tuple[int, list[str]]:
    """(exit code, messages) for two load()ed files: 0 all bitwise equal, 1 some differ, 2
    different output sets."""
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b))
        return 2, [f"the files hold different outputs: {len(only)} in one only, e.g. {only[:5]}"]
    bad = []
    for k in a:
        ta, tb = a[k], b[k]
        if isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor):
            if ta.shape != tb.shape or ta.dtype != tb.dtype:
                bad.append(f"{k}: {tuple(ta.shape)} {ta.dtype} vs {tuple(tb.shape)} {tb.dtype}")
            elif not torch.equal(_bits(ta), _bits(tb)):
                bad.append(f"{k}: {int((_bits(ta) != _bits(tb)).sum())} bytes differ")
            continue
        da = digest(ta) if isinstance(ta, torch.Tensor) else ta
        db = digest(tb) if isinstance(tb, torch.Tensor) else tb
        if da[:2] != db[:2]:
            bad.append(f"{k}: {tuple(da[0])} {da[1]} vs {tuple(db[0])} {db[1]}")
        elif da[2] != db[2]:
            bad.append(f"{k}: the bytes differ (SHA-256)")
    head = f"{len(a)} outputs compared, {len(bad)} differ"
    return (1 if bad else 0), [head, *bad]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="run the matrix with the importable te_fast, save outputs")
    s.add_argument("out")
    s.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    s.add_argument("--quick", action="store_true", help="a few short rows (seconds on a CPU)")
    s.add_argument(
        "--tensors", action="store_true", help="save the outputs (torch.save), not their digests"
    )
    c = sub.add_parser("compare", help="compare two saved files bitwise")
    c.add_argument("a")
    c.add_argument("b")
    args = p.parse_args(argv)
    if args.cmd == "save":
        if args.tensors:
            out = dict(outputs(args.device, args.quick))
            torch.save(out, args.out)
        else:
            out = {name: digest(t) for name, t in outputs(args.device, args.quick)}
            lines = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in out.items())
            with open(args.out, "w") as f:  # one line per output
                head = json.dumps({"device": args.device, "torch": torch.__version__})[:-1]
                f.write(f'{head}, "outputs": {{\n{lines}\n}}}}\n')
        kind = "outputs" if args.tensors else "digests"
        print(f"softmax_bits: saved {len(out)} {kind} ({args.device}) to {args.out}")
        return 0
    code, lines = compare(load(args.a), load(args.b))
    print("softmax_bits: " + "\n  ".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
