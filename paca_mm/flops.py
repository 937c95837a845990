"""FLOP (fvcore-style MAC) counting with mmengine's ``FlopAnalyzer``, attention included.

mmengine has no handle for ``aten::scaled_dot_product_attention`` (nor ``baddbmm`` /
``addbmm``) and silently drops it, which leaves PaCa's attention products out of every count.
``import paca_mm`` calls :func:`install_flop_handles`, which adds the handles below to the
defaults of every ``FlopAnalyzer`` mmengine builds, so the stock tools count them too
(``mmengine.analysis.get_model_complexity_info``, the toolboxes' ``get_flops.py``).
:func:`count` is the counter of ``tools/get_flops.py`` and ``dev/benchmark.py``.

ConvFFN's memory-efficient Function runs only in a training forward that records gradients,
never under tracing, so the counters see its standard ops (the depth-wise conv and the
linear layers, which mmengine counts).
"""
import math
import warnings
from typing import Dict, List, Tuple

import mmengine
import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer, complexity_analysis, parameter_count
from mmengine.analysis.jit_handles import get_shape


def sdpa_flop_jit(inputs: List, outputs: List) -> int:
    """MACs of ``aten::scaled_dot_product_attention(q, k, v, ...)``.

    q: (..., N_q, d), k: (..., N_kv, d), v: (..., N_kv, d_v); the leading dims broadcast to
    the output's (..., N_q, d_v). MACs = prod(...) * N_q * N_kv * (d + d_v).
    """
    q, k, v = (get_shape(x) for x in inputs[:3])
    out = get_shape(outputs[0])
    if q is None or k is None or v is None or out is None:
        raise ValueError('scaled_dot_product_attention with unknown input shapes')
    return math.prod(int(s) for s in out[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def baddbmm_flop_jit(inputs: List, outputs: List) -> int:
    """MACs of ``aten::baddbmm(input, b1, b2)`` / ``aten::addbmm``: b1 (n, c, t) @ b2 (n, t, d)."""
    n, c, t = get_shape(inputs[1])
    return n * c * t * get_shape(inputs[2])[-1]


EXTRA_HANDLES = {
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
    'aten::baddbmm': baddbmm_flop_jit,
    'aten::addbmm': baddbmm_flop_jit,
}


def install_flop_handles() -> bool:
    """Add :data:`EXTRA_HANDLES` to the handles every mmengine ``FlopAnalyzer`` starts with.

    mmengine's only door for this is the private dict ``_DEFAULT_SUPPORTED_FLOP_OPS`` of
    ``mmengine.analysis.complexity_analysis``, which ``FlopAnalyzer.__init__`` reads
    (mmengine 0.7 to 0.10); ``get_model_complexity_info`` builds its own analyzer, so
    ``set_op_handle`` cannot reach it. Where that dict is missing the stock counters keep
    leaving attention out: this warns and returns False (:func:`count` is unaffected).
    """
    ops = getattr(complexity_analysis, '_DEFAULT_SUPPORTED_FLOP_OPS', None)
    if not isinstance(ops, dict) or 'aten::matmul' not in ops:
        warnings.warn(
            f'paca_mm: mmengine {mmengine.__version__} has no FLOP handle table '
            '(mmengine.analysis.complexity_analysis._DEFAULT_SUPPORTED_FLOP_OPS) to add the '
            'attention handles to: its get_model_complexity_info leaves '
            'scaled_dot_product_attention out of the count. Use tools/get_flops.py (or '
            'paca_mm.flops.count), which counts it.')
        return False
    ops.update(EXTRA_HANDLES)
    return True


def count(model: nn.Module, inputs: Tuple, show_unsupported: bool = False) -> Dict:
    """Trace ``model(*inputs)`` once (eval mode, no grad) and count.

    Returns dict(flops=int MACs, params=int, by_module={top-level child: MACs},
    params_by_module={child: params}, unsupported={op: calls}).
    """
    model.eval()
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**EXTRA_HANDLES)
    analyzer.unsupported_ops_warnings(show_unsupported)
    analyzer.uncalled_modules_warnings(False)
    analyzer.tracer_warnings('none')
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        total = analyzer.total()
        by_module = analyzer.by_module()
        unsupported = dict(analyzer.unsupported_ops())
    params = parameter_count(model)
    children = [n for n, _ in model.named_children()]
    return dict(flops=int(total), params=int(params['']),
                by_module={n: int(by_module.get(n, 0)) for n in children},
                params_by_module={n: int(params.get(n, 0)) for n in children},
                unsupported=unsupported)
