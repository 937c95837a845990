"""FLOP (fvcore-style MAC) counting with mmengine's ``FlopAnalyzer``, attention included.

mmengine has no handle for ``aten::scaled_dot_product_attention`` and silently drops it;
:func:`count` adds one (and for ``baddbmm``/``addbmm``, and for ConvFFN's
:class:`~paca_mm.models.layers.common.DWConvGELULinear`, which the tracer records as one
``prim::PythonOp``). Used by ``tools/get_flops.py`` and
``tools/benchmark.py``.
"""
import warnings
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.analysis import FlopAnalyzer, parameter_count
from mmengine.analysis.jit_handles import get_shape


def _prod(shape: Sequence[int]) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def sdpa_flop_jit(inputs: List, outputs: List) -> int:
    """MACs of ``aten::scaled_dot_product_attention(q, k, v, ...)``.

    q: (..., N_q, d), k: (..., N_kv, d), v: (..., N_kv, d_v); the leading dims broadcast to
    the output's (..., N_q, d_v). MACs = prod(...) * N_q * N_kv * (d + d_v).
    """
    q, k, v = (get_shape(x) for x in inputs[:3])
    out = get_shape(outputs[0])
    if q is None or k is None or v is None or out is None:
        raise ValueError('scaled_dot_product_attention with unknown input shapes')
    batch = _prod(out[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def baddbmm_flop_jit(inputs: List, outputs: List) -> int:
    """MACs of ``aten::baddbmm(input, b1, b2)`` / ``aten::addbmm``: b1 (n, c, t) @ b2 (n, t, d)."""
    b1, b2 = get_shape(inputs[1]), get_shape(inputs[2])
    n, c, t = b1
    return n * c * t * b2[-1]


def dwconv_gelu_linear_flop_jit(inputs: List, outputs: List) -> int:
    """MACs of ConvFFN's tail ``fc(GELU(h + DWConv3x3(h)))``: h (B, rC, H, W), fc weight
    (C, rC); the depth-wise 3x3 conv (9 per element of h) and the linear (C per element),
    as mmengine counts ``aten::_convolution`` and ``aten::linear``."""
    h, fc_weight = get_shape(inputs[0]), get_shape(inputs[3])
    return _prod(h) * (9 + fc_weight[0])


EXTRA_HANDLES = {
    'aten::scaled_dot_product_attention': sdpa_flop_jit,
    'aten::baddbmm': baddbmm_flop_jit,
    'aten::addbmm': baddbmm_flop_jit,
    'prim::PythonOp.DWConvGELULinear': dwconv_gelu_linear_flop_jit,
}


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
