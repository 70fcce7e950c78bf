"""A pytest plugin that runs every torch scaled_dot_product_attention call under the MATH
backend, to tell torch.sdpa's CPU flash-attention kernel from the math it computes
(docs/reports.md):

    PYTHONPATH=tools python -m pytest -p no:xdist -p sdpa_math --impl torch.sdpa NODE_ID ...
"""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

_sdpa = torch.nn.functional.scaled_dot_product_attention


def _math_backend(*args, **kwargs):
    with sdpa_kernel([SDPBackend.MATH]):
        return _sdpa(*args, **kwargs)


torch.nn.functional.scaled_dot_product_attention = _math_backend
