"""After ``import paca_mm``, mmengine's own FLOP counter (``get_model_complexity_info``, which
the toolboxes' get_flops tools call) counts PaCa's attention products and ConvFFN exactly as
:func:`paca_mm.flops.count` does: PaCa-Tiny at 224x224 is the paper's 3.2 GFLOPs (3.24 G
MACs); mmengine alone leaves attention out (3.00 G)."""
import os
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch
from mmengine.analysis import get_model_complexity_info

import paca_mm  # noqa: F401  (installs the handles)
from paca_mm.flops import EXTRA_HANDLES, count, install_flop_handles

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(ROOT, 'configs', 'paca_vit_imagenet',
                  'pacavit_tiny_p2cconv_100_0_8xb128_in1k.py')
TINY_224 = 3.237e9  # MACs of the official PaCa-Tiny classifier at 224x224


@pytest.fixture(scope='module')
def classifier():
    """The PaCa-Tiny ImageNet classifier of the model zoo config (mmpretrain)."""
    from mmengine.config import Config
    from mmpretrain.registry import MODELS
    return MODELS.build(Config.fromfile(CONFIG).model).eval()


def _stock(model, shape):
    return get_model_complexity_info(model, (3, *shape), show_table=False,
                                     show_arch=False)['flops']


@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
def test_stock_counter_equals_ours(classifier, train):
    """Same count at a small size, also for a model left in training mode with autograd on
    (the stock counter sets neither eval nor no_grad): the trace takes ConvFFN's standard
    ops, and the attention is counted."""
    x = torch.randn(1, 3, 64, 96)
    ours = count(classifier, (x, ))
    assert not ours['unsupported'].get('aten::scaled_dot_product_attention')
    classifier.train(train)
    try:
        assert _stock(classifier, (64, 96)) == ours['flops']
    finally:
        classifier.eval()


def test_stock_counter_paca_tiny_224(classifier):
    assert abs(_stock(classifier, (224, 224)) - TINY_224) / TINY_224 < 0.01


def test_install_warns_on_an_unexpected_mmengine(monkeypatch):
    """Where mmengine's default handle table is not there, importing paca_mm warns (naming
    the tool that still counts attention) instead of failing."""
    from mmengine.analysis import complexity_analysis
    table = complexity_analysis._DEFAULT_SUPPORTED_FLOP_OPS
    assert all(table[op] is handle for op, handle in EXTRA_HANDLES.items())
    monkeypatch.delattr(complexity_analysis, '_DEFAULT_SUPPORTED_FLOP_OPS')
    with pytest.warns(UserWarning, match='tools/get_flops.py'):
        assert install_flop_handles() is False


@pytest.mark.slow
def test_mmpretrain_get_flops_tool():
    """mmpretrain's own ``tools/analysis_tools/get_flops.py`` on the model zoo config (its
    ``custom_imports`` imports paca_mm): backbone + neck, the paper's 3.2 GFLOPs."""
    import mmpretrain
    tool = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools', 'analysis_tools',
                    'get_flops.py')
    if not osp.isfile(tool):
        pytest.skip(f'mmpretrain installed without its tools ({tool})')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, tool, CONFIG], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    flops = re.search(r'^Flops: ([\d.]+)G$', proc.stdout, re.M)
    assert flops, proc.stdout[-3000:]
    assert abs(float(flops.group(1)) * 1e9 - TINY_224) / TINY_224 < 0.01
