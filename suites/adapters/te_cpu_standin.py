"""Transformer Engine 2.20.2's real Python on the CPU: the stand-ins for what cannot exist there.

Used by suites/adapters/transformer_engine.py only when TE's native extension cannot be imported
on a machine without CUDA; on a GPU runner with the real TE (wheel and extension) nothing here
runs. What is TE's code and what is stood in (docs/transformer_engine.md has the same list).
TE paths are relative to the installed package ``transformer_engine/``; ``dpa.py`` is
``pytorch/attention/dot_product_attention/dot_product_attention.py`` and ``utils.py``,
``backends.py``, ``softmax.py`` are in that folder.

Stood in (nothing else):

1. The native library loader. ``common/__init__.py:488`` loads cuDNN, NVRTC, cuRAND, cuBLAS,
   cudart and ``libtransformer_engine.so`` at import unless ``NVTE_PROJECT_BUILDING`` is set
   (TE's own build-time switch, set by TE's setup.py while it builds; set here only while TE is
   imported). ``pytorch/__init__.py:18`` then calls ``load_framework_extension("torch")``
   (``common/__init__.py:172-246``), which loads ``transformer_engine_torch*.so``; an import hook
   replaces that one function on ``transformer_engine.common`` right after the module has
   executed, with one that puts the stand-in module below into ``sys.modules``.
2. The native extension module ``transformer_engine_torch`` (``tex``): the enums TE's Python
   reads (values from TE's C headers: transformer_engine.h, fused_attn.h, pytorch/csrc/common.h);
   ``convert_thd_to_bshd`` / ``convert_bshd_to_thd``, torch re-implementations of the C++
   wrappers in ``pytorch/csrc/extensions/attention.cpp`` (zeros, then each sequence's rows),
   called by TE's custom ops ``te_attention::convert_*`` (utils.py:2504-2590);
   ``get_cudnn_version``. Every other name is a placeholder whose call raises
   NotImplementedError, so a native call on a path not expected here is loud, never faked.

TE's own switches choose its paths (``RUN_ENV``): NVTE_FLASH_ATTN=0, NVTE_FUSED_ATTN=0,
NVTE_UNFUSED_ATTN=1 (get_attention_backend keeps UnfusedDotProductAttention only) and
NVTE_MASKED_SOFTMAX_FUSION=0 (softmax.py:265-267, read at construction; is_kernel_available
then returns False at its first test, softmax.py:300-301): the softmax is TE's own torch
fallback ``forward_torch_softmax`` (softmax.py:354-384) for every dtype.

Redirected, only inside ``cpu_redirect()`` (TE's construction and forward; the backward needs
none), undone on exit:

- ``torch.cuda.is_available`` -> True (module/base.py:895 refuses to build a module without it);
- ``torch.cuda.current_device`` -> 0 (backends.py:582 ``matmul_result`` device;
  pytorch/utils.py:161);
- ``torch.cuda.get_device_properties`` -> an sm90 (pytorch/utils.py:154, read by
  get_attention_backend; TE caches it with lru_cache);
- a TorchFunctionMode: a tensor TE asks for on ``"cuda"`` or an int device is made on the CPU
  (dpa.py:965, 970 softmax_offset; utils.py:1964 get_padding_mask ``.to(device="cuda")``,
  get_full_mask, get_alibi, get_cu_seqlens; softmax.py:239 the causal mask), and ``x.is_cuda``
  reads True (dpa.py:2357 "DotProductAttention only supports CUDA tensors", module/base.py:1605).

No TE file is edited or copied.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types

import torch

TE_VERSION = "2.20.2"  # the release the line numbers above refer to

# TE's build-time switch that skips loading its native libraries (common/__init__.py:488); set
# only while TE is imported.
IMPORT_ENV = {"NVTE_PROJECT_BUILDING": "1"}
# TE's own switches, set before TE is imported and kept (TE reads them when a module is built).
RUN_ENV = {
    "NVTE_FLASH_ATTN": "0",
    "NVTE_FUSED_ATTN": "0",
    "NVTE_UNFUSED_ATTN": "1",
    "NVTE_MASKED_SOFTMAX_FUSION": "0",
}


# ----------------------------------------------------------------------------- enums
# pybind11 enums of common/util/pybind_helper.h and pytorch/csrc/extensions/pybind.cpp; values
# from the C headers. DType must equal TE's own table (pytorch/constants.py:93 reads it),
# NVTE_Fused_Attn_Backend is read by cpp_extensions/fused_attn.py:158.


class DType(enum.IntEnum):
    kByte = 0
    kInt32 = 2
    kFloat32 = 4
    kFloat16 = 5
    kBFloat16 = 6
    kFloat8E4M3 = 7
    kFloat8E5M2 = 8
    kFloat4E2M1 = 10


class NVTE_Bias_Type(enum.IntEnum):
    NVTE_NO_BIAS = 0
    NVTE_PRE_SCALE_BIAS = 1
    NVTE_POST_SCALE_BIAS = 2
    NVTE_ALIBI = 3


class NVTE_Mask_Type(enum.IntEnum):
    NVTE_NO_MASK = 0
    NVTE_PADDING_MASK = 1
    NVTE_CAUSAL_MASK = 2
    NVTE_PADDING_CAUSAL_MASK = 3
    NVTE_CAUSAL_BOTTOM_RIGHT_MASK = 4
    NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK = 5
    NVTE_ARBITRARY_MASK = 6


class NVTE_Softmax_Type(enum.IntEnum):
    NVTE_VANILLA_SOFTMAX = 0
    NVTE_OFF_BY_ONE_SOFTMAX = 1
    NVTE_LEARNABLE_SOFTMAX = 2


class NVTE_QKV_Format(enum.IntEnum):
    NVTE_SBHD = 0
    NVTE_BSHD = 1
    NVTE_THD = 2
    NVTE_BSHD_2SBHD = 3
    NVTE_SBHD_2BSHD = 4
    NVTE_THD_2BSHD = 5
    NVTE_THD_2SBHD = 6
    NVTE_BHSD = 7
    NVTE_QKV_Format_NOT_SET = 8


_LAYOUTS = (
    "SB3HD SBH3D SBHD_SB2HD SBHD_SBH2D SBHD_SBHD_SBHD BS3HD BSH3D BSHD_BS2HD BSHD_BSH2D "
    "BSHD_BSHD_BSHD T3HD TH3D THD_T2HD THD_TH2D THD_THD_THD SBHD_BSHD_BSHD BSHD_SBHD_SBHD "
    "THD_BSHD_BSHD THD_SBHD_SBHD Paged_KV_BSHD_BSHD_BSHD Paged_KV_BSHD_SBHD_SBHD "
    "Paged_KV_SBHD_BSHD_BSHD Paged_KV_SBHD_SBHD_SBHD Paged_KV_THD_BSHD_BSHD "
    "Paged_KV_THD_SBHD_SBHD BHSD_BHSD_BHSD QKV_Layout_NOT_SET"
).split()
# NVTE_QKV_Layout_NOT_SET is read at utils.py:385
NVTE_QKV_Layout = enum.IntEnum("NVTE_QKV_Layout", {f"NVTE_{n}": i for i, n in enumerate(_LAYOUTS)})


class NVTE_Fused_Attn_Backend(enum.IntEnum):
    NVTE_No_Backend = -1
    NVTE_F16_arbitrary_seqlen = 1
    NVTE_FP8 = 2


class FP8FwdTensors(enum.IntEnum):
    GEMM1_INPUT = 0
    GEMM1_WEIGHT = 1
    GEMM1_OUTPUT = 2
    GEMM2_INPUT = 3
    GEMM2_WEIGHT = 4
    GEMM2_OUTPUT = 5
    GEMM3_INPUT = 6
    GEMM3_WEIGHT = 7
    GEMM3_OUTPUT = 8


class FP8BwdTensors(enum.IntEnum):
    GRAD_OUTPUT1 = 0
    GRAD_INPUT1 = 1
    GRAD_OUTPUT2 = 2
    GRAD_INPUT2 = 3
    GRAD_OUTPUT3 = 4
    GRAD_INPUT3 = 5


# ----------------------------------------------------------------------------- the conversions
# pytorch/csrc/extensions/attention.cpp:
#   at::Tensor convert_thd_to_bshd(at::Tensor tensor, at::Tensor cu_seqlens, int b, int max_seq_len)
#   at::Tensor convert_bshd_to_thd(at::Tensor tensor, at::Tensor cu_seqlens, int t)
# Both allocate zeros and copy each sequence's rows (the CUDA kernels thd_bshd / bshd_thd).


def convert_thd_to_bshd(tensor: torch.Tensor, cu_seqlens: torch.Tensor, b: int, max_seq_len: int):
    """[t, h, d] -> zero-padded [b, max_seq_len, h, d]."""
    out = tensor.new_zeros((b, max_seq_len, *tensor.shape[1:]))
    cu = cu_seqlens.tolist()
    for x in range(b):
        n = min(cu[x + 1] - cu[x], max_seq_len)
        out[x, :n] = tensor[cu[x] : cu[x] + n]
    return out


def convert_bshd_to_thd(tensor: torch.Tensor, cu_seqlens: torch.Tensor, t: int):
    """[b, s, h, d] -> [t, h, d]; rows no sequence covers are 0."""
    out = tensor.new_zeros((t, *tensor.shape[2:]))
    cu = cu_seqlens.tolist()
    for x in range(tensor.shape[0]):
        n = min(cu[x + 1] - cu[x], tensor.shape[1])
        out[cu[x] : cu[x] + n] = tensor[x, :n]
    return out


def get_cudnn_version() -> int:
    return 91200  # the oldest cuDNN TE accepts (common/__init__.py MIN_CUDNN_VERSION)


# ----------------------------------------------------------------------------- placeholders


class _NativeMeta(type):
    """A native name TE's Python only mentions at import (annotations, isinstance, a base
    class): attribute reads give further placeholders; a call raises."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise NotImplementedError(
            f"transformer_engine_torch.{cls.__qualname__} is native TE code (CUDA); the CPU "
            "stand-in (suites/adapters/te_cpu_standin.py) does not provide it"
        )


def _placeholder(name: str) -> type:
    return _NativeMeta(name, (), {"__qualname__": name, "__module__": "transformer_engine_torch"})


PROVIDED = {
    "DType": DType,
    "NVTE_Bias_Type": NVTE_Bias_Type,
    "NVTE_Mask_Type": NVTE_Mask_Type,
    "NVTE_Softmax_Type": NVTE_Softmax_Type,
    "NVTE_QKV_Format": NVTE_QKV_Format,
    "NVTE_QKV_Layout": NVTE_QKV_Layout,
    "NVTE_Fused_Attn_Backend": NVTE_Fused_Attn_Backend,
    "FP8FwdTensors": FP8FwdTensors,
    "FP8BwdTensors": FP8BwdTensors,
    "convert_thd_to_bshd": convert_thd_to_bshd,
    "convert_bshd_to_thd": convert_bshd_to_thd,
    "get_cudnn_version": get_cudnn_version,
}


def make_tex() -> types.ModuleType:
    """The stand-in ``transformer_engine_torch``: PROVIDED, and a placeholder for any other name
    (``placeholders_read`` lists the names TE read)."""
    tex = types.ModuleType("transformer_engine_torch")
    tex.__doc__ = "CPU stand-in for TE's native extension (suites/adapters/te_cpu_standin.py)"
    tex.__dict__.update(PROVIDED)
    tex.placeholders_read = []
    cache: dict[str, type] = {}

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in cache:
            tex.placeholders_read.append(name)
            cache[name] = _placeholder(name)
        return cache[name]

    tex.__getattr__ = __getattr__
    return tex


# ----------------------------------------------------------------------------- the loader


def _stand_in_loader(framework: str) -> None:
    """In place of transformer_engine.common.load_framework_extension (common/__init__.py:172):
    the stand-in module instead of transformer_engine_torch*.so."""
    if framework != "torch":
        raise FileNotFoundError(f"the CPU stand-in has no {framework} extension")
    sys.modules.setdefault("transformer_engine_torch", make_tex())


class _CommonHook(importlib.abc.MetaPathFinder):
    """After transformer_engine.common has executed, swap in the stand-in loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "transformer_engine.common":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            module.load_framework_extension = _stand_in_loader

        spec.loader.exec_module = exec_and_patch
        return spec


@contextlib.contextmanager
def _env(values: dict):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def forget_te() -> None:
    """Drop every transformer_engine module (a failed import leaves half of them behind)."""
    for name in [m for m in sys.modules if m.split(".")[0] == "transformer_engine"]:
        del sys.modules[name]
    sys.modules.pop("transformer_engine_torch", None)


def import_te() -> types.ModuleType:
    """transformer_engine.pytorch imported with the stand-ins (once per process); RUN_ENV stays
    set afterwards."""
    tex = sys.modules.get("transformer_engine_torch")
    if "transformer_engine.pytorch" in sys.modules and is_stand_in(tex):
        return sys.modules["transformer_engine.pytorch"]
    forget_te()
    hook = _CommonHook()
    sys.meta_path.insert(0, hook)
    try:
        os.environ.update(RUN_ENV)
        with _env(IMPORT_ENV):
            return importlib.import_module("transformer_engine.pytorch")
    finally:
        sys.meta_path.remove(hook)


def is_stand_in(tex) -> bool:
    """Whether ``tex`` is the stand-in made by make_tex (not TE's native module)."""
    return isinstance(tex, types.ModuleType) and "placeholders_read" in vars(tex)


# ----------------------------------------------------------------------------- CUDA redirection


def _is_cuda_device(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.split(":")[0] == "cuda"
    return isinstance(dev, int) and not isinstance(dev, bool)  # torch.cuda.current_device()


class CudaToCpu(torch.overrides.TorchFunctionMode):
    """While TE code runs: a tensor TE asks for on CUDA (device="cuda" or an int, .to("cuda"),
    .cuda()) is made on the CPU, and ``x.is_cuda`` reads True. Nothing else changes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func == torch.Tensor.is_cuda.__get__:  # a fresh method-wrapper each time: ==
            return True
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to:
            args = tuple("cpu" if i and _is_cuda_device(a) else a for i, a in enumerate(args))
        return func(*args, **kwargs)


# What TE reads of the device (pytorch/utils.py:152-161): an sm90.
DEVICE_PROPERTIES = types.SimpleNamespace(
    name="CPU (suites/adapters/te_cpu_standin.py, answering as sm90)", major=9, minor=0,
    total_memory=80 * 2**30, multi_processor_count=132,
)  # fmt: skip


def _redirects():
    return [
        (torch.cuda, "is_available", lambda: True),  # module/base.py:895
        (torch.cuda, "current_device", lambda: 0),  # backends.py:582, pytorch/utils.py:161
        (torch.cuda, "get_device_properties", lambda device=None: DEVICE_PROPERTIES),  # :154
    ]


@contextlib.contextmanager
def cpu_redirect():
    """While TE code runs on CPU tensors: TE's CUDA queries answered as an sm90 would, the
    tensors it asks for on CUDA made on the CPU. Undone on exit, also on an error."""
    patches = _redirects()
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        with CudaToCpu():
            yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
