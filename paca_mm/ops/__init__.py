"""paca_mm's compiled CPU ops (``paca_mm/ops/csrc``), built by ``pip install``.

For float32 CPU inference, each runs one band of tokens per thread at a time, so that the
band's intermediates stay in that core's L2 cache:

* ``torch.ops.paca_mm.conv_ffn_inference`` (``conv_ffn.cpp``): a whole ConvFFN (LN, fc1,
  depth-wise 3x3 + shortcut, exact GELU, fc2, residual add), bands of image rows;
* ``torch.ops.paca_mm.p2c_attention_inference`` (``p2c_attention.cpp``): the attention of
  the tokens to the M cluster tokens (q projection, per-head softmax(q k^T) v, output
  projection, residual add), bands of tokens.

Where each thread has enough tokens, their GEMMs run against weights the thread packs once per
call into MKL's internal layout (``gemm.h``; :func:`packed_gemm`), if libtorch exports MKL's
packed-GEMM functions (its x86 builds do); otherwise, or with ``PACA_MM_PACKED_GEMM=0``, they
call ATen's mm.

The Python code falls back to ATen/oneDNN ops when the library is not built; :func:`status`
says why.

Build them in a source checkout with ``python setup.py build_ext --inplace`` (what
``tools/setup_env.sh`` does after ``pip install -e .``). ``PACA_MM_NO_OPS=1`` in the
environment turns them off at build and at run time.
"""
import glob
import os
import os.path as osp
import warnings

import torch

_HERE = osp.dirname(osp.dirname(osp.abspath(__file__)))
_STATUS = None  # (loaded: bool, reason: str)
_TURNED_OFF = 'turned off by PACA_MM_NO_OPS=1'
OPS = ('conv_ffn_inference', 'p2c_attention_inference', 'packed_gemm_enabled',
       'packed_gemm_count')


def _load():
    if os.environ.get('PACA_MM_NO_OPS', '0') == '1':
        return False, _TURNED_OFF
    libs = sorted(glob.glob(osp.join(_HERE, '_ops*.so')))
    if not libs:
        return False, ('paca_mm/_ops*.so is not built (run `python setup.py build_ext '
                       '--inplace` in the paca_mm checkout)')
    try:
        torch.ops.load_library(libs[0])
    except (OSError, RuntimeError) as e:  # e.g. built against another torch
        return False, (f'{libs[0]} does not load ({e}); rebuild it with '
                       '`python setup.py build_ext --inplace --force`')
    for name in OPS:
        if not hasattr(torch.ops.paca_mm, name):
            return False, (f'{libs[0]} does not define paca_mm::{name} (built from older '
                           'sources); rebuild it with `python setup.py build_ext --inplace '
                           '--force`')
    return True, f'loaded {libs[0]}'


def status():
    """(available, reason): whether the compiled op is loaded, and from where or why not."""
    global _STATUS
    if _STATUS is None:
        _STATUS = _load()
    return _STATUS


_WARNED = False


def available() -> bool:
    """Whether the ops (``OPS``) can be called. Warns once per process when they cannot
    (the slower pure-ATen paths are used then)."""
    global _WARNED
    ok, reason = status()
    if not ok and not _WARNED and reason != _TURNED_OFF:
        _WARNED = True
        warnings.warn(f'paca_mm: the compiled CPU ops are unavailable, using the ATen paths '
                      f'(slower on CPU): {reason}')
    return ok


def require() -> None:
    """Load the ops, or raise a RuntimeError that says why they are unavailable (for code
    that calls them directly, such as the layers' ``forward_op`` methods)."""
    ok, reason = status()
    if not ok:
        raise RuntimeError(f'paca_mm: the compiled CPU ops are unavailable: {reason}')


def packed_gemm() -> bool:
    """Whether the ops' GEMMs may run on weights packed once per thread and call (MKL's
    cblas_sgemm_pack/compute, exported by libtorch's x86 builds; off with
    ``PACA_MM_PACKED_GEMM=0``) rather than through ATen's mm: they do where each thread has
    enough tokens to repay the packing (``gemm.h``). False without the ops."""
    return status()[0] and bool(torch.ops.paca_mm.packed_gemm_enabled())
