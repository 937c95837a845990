"""paca_mm's compiled CPU op (``paca_mm/ops/csrc/conv_ffn.cpp``), built by ``pip install``.

``torch.ops.paca_mm.conv_ffn_inference`` runs a whole ConvFFN (LN, fc1, depth-wise 3x3 +
shortcut, exact GELU, fc2, residual add) for float32 CPU inference, one band of image rows
per thread at a time so that the hidden map stays in each core's L2 cache. The Python code
falls back to ATen/oneDNN ops when the library is not built; :func:`status` says why.

Build it in a source checkout with ``python setup.py build_ext --inplace`` (what
``tools/setup_env.sh`` does after ``pip install -e .``). ``PACA_MM_NO_OPS=1`` in the
environment turns it off at build and at run time.
"""
import glob
import os
import os.path as osp
import warnings

import torch

_HERE = osp.dirname(osp.dirname(osp.abspath(__file__)))
_STATUS = None  # (loaded: bool, reason: str)
_TURNED_OFF = 'turned off by PACA_MM_NO_OPS=1'


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
    if not hasattr(torch.ops.paca_mm, 'conv_ffn_inference'):
        return False, f'{libs[0]} does not define paca_mm::conv_ffn_inference; rebuild it'
    return True, f'loaded {libs[0]}'


def status():
    """(available, reason): whether the compiled op is loaded, and from where or why not."""
    global _STATUS
    if _STATUS is None:
        _STATUS = _load()
    return _STATUS


_WARNED = False


def available() -> bool:
    """Whether ``torch.ops.paca_mm.conv_ffn_inference`` can be called. Warns once per
    process when it cannot (the slower pure-ATen path is used then)."""
    global _WARNED
    ok, reason = status()
    if not ok and not _WARNED and reason != _TURNED_OFF:
        _WARNED = True
        warnings.warn(f'paca_mm: the compiled CPU FFN op is unavailable, using the ATen path '
                      f'(slower on CPU): {reason}')
    return ok
