"""The benchmark matrix as data: sections, dtypes, row lengths, shapes, and the smoke variant."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from te_conformance.suites.cases import DTYPES  # noqa: F401  (the one name -> dtype table)

SECTIONS = ("softmax", "convert", "module", "small", "stack")
SK_ALL = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# Square [b, h, s, s] cases of the causal ops (ops_bench.run_square), where TE runs beside te_fast
SQUARE_SK = (128, 256, 512, 1024, 2048, 4096)
SOFTMAX_PEERS = ("torch", "inductor", "triton", "te")  # te: benchmarks/te_peer.py
SCALE = 0.125  # softmax scale of the op benchmarks (any value > 0 moves the same bytes)


@dataclass(frozen=True)
class SoftmaxOp:
    """One te_fast softmax op pair. masking: none | mask | upper_triang | aligned_causal."""

    name: str
    masking: str
    rank: int  # 4: [b, h, sq, sk]; 3: [b*h, sq, sk]

    @property
    def fwd(self) -> str:
        return self.name  # te_fast.ops.<name>

    @property
    def bwd(self) -> str:
        return f"{self.name}_bwd"


SOFTMAX_OPS = (
    SoftmaxOp("scaled_softmax", "none", 4),
    SoftmaxOp("scaled_masked_softmax", "mask", 4),
    SoftmaxOp("scaled_upper_triang_masked_softmax", "upper_triang", 3),
    SoftmaxOp("scaled_aligned_causal_masked_softmax", "aligned_causal", 4),
)
CAUSAL_OPS = tuple(op for op in SOFTMAX_OPS if op.masking in ("upper_triang", "aligned_causal"))


@dataclass(frozen=True)
class AttnShape:
    b: int
    h: int
    s: int
    d: int

    def __str__(self) -> str:
        return f"b{self.b} h{self.h} s{self.s} d{self.d}"


@dataclass
class Plan:
    """Everything one run does; built from the command line by __main__."""

    sections: tuple[str, ...] = SECTIONS
    dtypes: tuple[str, ...] = ("bf16", "fp16", "fp32")
    sks: tuple[int, ...] = SK_ALL
    square_sks: tuple[int, ...] = SQUARE_SK
    numel16: int = 256 << 20  # elements per softmax case for 16-bit dtypes (fp32: half)
    reps: int = 30
    peers: tuple[str, ...] = SOFTMAX_PEERS
    inductor: str = "static"  # static: one compile per (dtype, sk, fn); dynamic: per (dtype, fn)
    inductor_dtypes: tuple[str, ...] = ("bf16",)
    deadline_s: float = 540.0
    compile_budget_s: float = 75.0  # softmax inductor peers only; module compiles always run
    smoke: bool = False
    # softmax inputs (x, dy) one element past an aligned address: the one-element kernels
    misaligned: bool = False
    softmax_bh: tuple[int, int] = (4, 16)
    ceiling_bytes: int = 1 << 30
    convert_shape: AttnShape = field(default_factory=lambda: AttnShape(32, 16, 2048, 128))
    module_shape: AttnShape = field(default_factory=lambda: AttnShape(16, 32, 2048, 128))
    small_shape: AttnShape = field(default_factory=lambda: AttnShape(2, 16, 128, 64))
    stack_layers: int = 8
    warmup: int = 5

    @property
    def module_reps(self) -> int:
        return max(3, self.reps // 3)

    @property
    def small_reps(self) -> int:
        return self.reps if self.smoke else max(20, 4 * self.reps)

    @property
    def small_warmup(self) -> int:
        return self.warmup if self.smoke else max(5, self.warmup)

    def numel(self, dtype: str) -> int:
        return self.numel16 // 2 if dtype == "fp32" else self.numel16

    def softmax_shape(self, dtype: str, sk: int) -> tuple[int, int, int, int]:
        b, h = self.softmax_bh
        return b, h, max(1, self.numel(dtype) // (b * h * sk)), sk

    def square_shape(self, dtype: str, s: int) -> tuple[int, int, int, int]:
        """[b, h, s, s] of about numel(dtype) elements (at least one batch), h of softmax_bh:
        the same bytes a case as the [b, h, sq, sk] cases, so no case fits in the L2."""
        h = self.softmax_bh[1]
        return max(1, self.numel(dtype) // (h * s * s)), h, s, s

    def module_dtypes(self) -> tuple[str, ...]:
        """The training-shape module runs in bf16 and fp16 (those of --dtypes)."""
        return tuple(d for d in self.dtypes if d in ("bf16", "fp16"))

    def small_dtype(self) -> str:
        """Small shape and stack: bf16, unless --dtypes leaves it out."""
        return "bf16" if "bf16" in self.dtypes else self.dtypes[0]


def smoke_plan(base: Plan) -> Plan:
    """A tiny matrix for the CPU: every code path once, in seconds; timings mean nothing."""
    return Plan(
        sections=base.sections,
        dtypes=("fp32", "bf16"),
        sks=(64, 128),
        square_sks=(16, 32),
        numel16=1 << 13,
        reps=2,
        peers=tuple(p for p in base.peers if p != "triton" or _triton_interpreter()),
        inductor=base.inductor,
        inductor_dtypes=("bf16",),
        deadline_s=base.deadline_s,
        compile_budget_s=base.compile_budget_s,
        smoke=True,
        misaligned=base.misaligned,
        softmax_bh=(2, 2),
        ceiling_bytes=1 << 20,
        convert_shape=AttnShape(3, 2, 16, 8),
        module_shape=AttnShape(2, 2, 16, 8),
        small_shape=AttnShape(1, 2, 16, 8),
        stack_layers=2,
        warmup=1,
    )


# Guessed costs on an H200 host (seconds), for the estimate printed before a run; the run prints
# the real figures (sections_s, compiles) to correct them.
COST_S = {
    "startup": 10.0,  # imports, CUDA context, the ceilings
    "softmax_case": 0.25,  # one (dtype, sk): ~13 timed rows of ~0.35 ms x 36 calls, checks
    "square_case": 0.15,  # one (dtype, s): te_fast's and TE's causal rows, ~8 timed
    "inductor_first": 10.0,  # inductor's compile workers start with the first compile
    "inductor_softmax": 1.5,  # one static softmax composite: trace, codegen, Triton, autotune
    "triton": 0.7,  # one JIT compile of the peer (per dtype and BLOCK)
    "convert": 1.0,  # per dtype
    "module_compile": 7.0,  # te_fast or the composite, forward + backward, training shape
    "module_config": 6.0,  # timings of ~8 implementations and the float64 reference
    "module_roofline": 4.0,  # per dtype: te_fast eager at THD, the GEMMs alone, three profiles
    "small_compile": 7.0,  # reduce-overhead, with CUDA-graph warm-up
    "stack_compile": 15.0,  # 8 layers traced and compiled
    "launch_bound_section": 7.0,  # timings of small or stack, with their paired rounds (~3 s)
}


def estimate(plan: Plan) -> dict:
    """Planned compiles and a rough run time (COST_S) for the given plan."""
    c = COST_S
    by: dict[str, float] = {"startup": c["startup"]}
    compiles: dict[str, int] = {}
    if "softmax" in plan.sections:
        n_cases = len(plan.dtypes) * len(plan.sks)
        n_ind = 0
        if "inductor" in plan.peers and plan.inductor != "off":
            n_dt = len([d for d in plan.dtypes if d in plan.inductor_dtypes])
            n_ind = 2 * n_dt * (len(plan.sks) if plan.inductor == "static" else 1)
        n_tri = n_cases if "triton" in plan.peers else 0
        compiles.update(inductor_softmax=n_ind, triton=n_tri)
        ind_s = min(n_ind * c["inductor_softmax"], plan.compile_budget_s)
        n_square = 0 if plan.misaligned else len(plan.dtypes) * len(plan.square_sks)
        by["softmax"] = (
            (n_cases * c["softmax_case"] + n_square * c["square_case"]) * plan.reps / 30
            + (c["inductor_first"] + ind_s if n_ind else 0)
            + n_tri * c["triton"]
        )
    if "convert" in plan.sections:
        by["convert"] = len(plan.dtypes) * c["convert"]
    if "module" in plan.sections:
        configs = 2 * len(plan.module_dtypes())
        compiles["module"] = 2 * configs
        by["module"] = configs * (2 * c["module_compile"] + c["module_config"])
        by["module"] += len(plan.module_dtypes()) * c["module_roofline"]
    for name, cost in (("small", "small_compile"), ("stack", "stack_compile")):
        if name in plan.sections:
            compiles[name] = 2
            by[name] = 2 * c[cost] + c["launch_bound_section"]
    by = {k: round(v) for k, v in by.items()}
    return {"seconds": sum(by.values()), "by_section": by, "compiles": compiles}


def _triton_interpreter() -> bool:
    """TRITON_INTERPRET=1 runs the Triton peer on CPU tensors (numpy): smoke can then cover it."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def parse_count(text: str) -> int:
    """'256M' -> 268435456; plain integers and K/M/G (powers of 1024) suffixes."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    if t and t[-1] in mult:
        return int(float(t[:-1]) * mult[t[-1]])
    return int(t)


def parse_list(text: str, allowed, what: str) -> tuple:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ValueError(f"{what}: {bad or 'empty'} not in {tuple(allowed)}")
    return items
