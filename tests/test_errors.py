"""Bad configuration, bad input and bad checkpoints give one clear error."""
import functools
import os
import re
import subprocess
import sys

import pytest
import torch

from paca_mm.checkpoint import CheckpointError, load_checkpoint_file
from paca_mm.models.backbones import PaCaViT

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCH = dict(embed_dims=(16, 32, 48, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8))


@pytest.mark.parametrize('kwargs,match', [
    (dict(arch='huge'), r"Unknown PaCaViT arch 'huge'. Valid: .*tiny"),
    (dict(arch=dict(embed_dims=(8,))), "needs 'depths'"),
    (dict(clustering='kmeans'), r"clustering must be one of \('conv', 'mlp', 'linear'\)"),
    (dict(num_clusters=(4, 4, 4)), r'num_clusters must have one entry per stage \(4\)'),
    (dict(num_clusters=(4, -1, 4, 0)), 'num_clusters must be >= 0'),
    (dict(arch=dict(ARCH, num_heads=(3, 2, 4, 8))), r'num_heads\[0\]=3 does not divide '
                                                     r'embed_dims\[0\]=16'),
    (dict(out_indices=(0, 4)), r'out_indices 4 out of range: valid are 0..3'),
    (dict(frozen_stages=5), r'frozen_stages must be in \[-1, 4\], got 5'),
    (dict(frozen_stages=-2), r'frozen_stages must be in \[-1, 4\], got -2'),
    (dict(cluster_sharing='sometimes'), "cluster_sharing must be 'stage', 'block'"),
    (dict(arch='tiny', teacher=True), 'has no teacher_depths'),
    (dict(teacher=dict(depths=(1, 1, 1))),
     r'teacher depths must have one entry per stage \(4\), got \[1, 1, 1\]'),
    (dict(init_cfg=dict(type='Kaiming')), 'supports init_cfg type "Pretrained" only'),
])
def test_bad_config(kwargs, match):
    kwargs = dict(dict(arch=ARCH, num_clusters=(4, 4, 4, 0)), **kwargs)
    with pytest.raises(ValueError, match=match):
        PaCaViT(**kwargs).init_weights()


@pytest.mark.parametrize('x,match', [
    (torch.randn(3, 32, 32), r'expects a 4-D \(B, C, H, W\) tensor, got \(3, 32, 32\)'),
    (torch.randn(1, 1, 32, 32), 'built with in_channels=3 but the input has 1 channels'),
    ([1, 2], 'expects a 4-D'),
    (torch.randn(1, 3, 0, 32), r'empty image \(1, 3, 0, 32\): H and W must be >= 1'),
])
def test_bad_input(x, match):
    model = PaCaViT(arch=ARCH)
    with pytest.raises(ValueError, match=match):
        model(x)


def test_truncated_checkpoint(tmp_path):
    good = tmp_path / 'good.pth'
    torch.save(PaCaViT(arch=ARCH).state_dict(), good)
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match='truncated or corrupt'):
        load_checkpoint_file(str(bad))
    garbage = tmp_path / 'garbage.pth'
    garbage.write_text('not a checkpoint')
    with pytest.raises(CheckpointError, match='garbage.pth'):
        load_checkpoint_file(str(garbage))


def _convert(*args):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'tools',
                                                        'convert_official_checkpoint.py'),
                           *map(str, args)], capture_output=True, text=True)


def test_converter_refuses_to_overwrite_its_input(tmp_path):
    src = tmp_path / 'IMNET_224_tiny.pth'
    torch.save(PaCaViT(arch=ARCH).state_dict(), src)
    before = src.read_bytes()
    res = _convert(src, src)
    assert res.returncode != 0 and 'refusing to overwrite the input' in res.stderr
    assert src.read_bytes() == before


def _convert_in_process(load_tool, *args):
    """``tools/convert_official_checkpoint.py`` through its ``main(argv)``: (exit code,
    error message), like the command line's (exit code, stderr)."""
    try:
        load_tool('convert_official_checkpoint').main([str(a) for a in args])
    except SystemExit as e:
        return 1 if isinstance(e.code, str) else e.code, str(e.code)
    return 0, ''


def test_converter_adapts_clusters_and_checks_arch(tmp_path, load_tool):
    convert = functools.partial(_convert_in_process, load_tool)
    model = PaCaViT(arch='tiny')
    sd = dict(model.state_dict(), **{'head.weight': torch.randn(5, 384),
                                     'head.bias': torch.randn(5)})
    src = tmp_path / 'IMNET_224_pacavit_tiny_p2cconv_100_0.pth'
    torch.save(sd, src)
    dst = tmp_path / 'out' / 'tiny_200.pth'
    code, err = convert(src, dst, '--arch', 'tiny', '--num-clusters', 200, 200, 200, 0)
    assert code == 0, err
    out = torch.load(dst, weights_only=True)['state_dict']
    PaCaViT(arch='tiny', num_clusters=(200, 200, 200, 0)).load_state_dict(out, strict=True)
    assert os.listdir(dst.parent) == ['tiny_200.pth']  # atomic write: no temporary file left
    # classifier layout
    code, err = convert(src, tmp_path / 'cls.pth', '--to', 'classifier', '--arch', 'tiny')
    assert code == 0, err
    cls = torch.load(tmp_path / 'cls.pth', weights_only=True)['state_dict']
    assert torch.equal(cls['head.fc.weight'], sd['head.weight'])
    assert 'backbone.stage1.0.attn.q.weight' in cls
    # wrong arch: a clear error naming what does not match
    code, err = convert(src, tmp_path / 'x.pth', '--arch', 'small')
    assert code != 0 and 'does not match arch' in err
    assert not (tmp_path / 'x.pth').exists()
    code, err = convert(tmp_path / 'missing.pth', tmp_path / 'y.pth')
    assert code != 0 and 'checkpoint not found' in err


@pytest.mark.parametrize('change', ['missing', 'unexpected', 'mismatched',
                                    'mismatched_bias'])
def test_adapt_cluster_layers_refuses_every_other_difference(change):
    """Only the cluster-count layers are adapted: a checkpoint that also lacks a key, has an
    extra one, or has another shape elsewhere raises, naming the key."""
    from paca_mm.checkpoint import adapt_cluster_layers
    model = PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 0))
    sd = dict(PaCaViT(arch=ARCH, num_clusters=(8, 8, 8, 0)).state_dict())
    assert adapt_cluster_layers(dict(sd), model).keys() == model.state_dict().keys()
    key = 'stage1.0.attn.q.weight'
    if change == 'missing':
        del sd[key]
    elif change == 'unexpected':
        key = 'stage1.0.attn.extra.weight'
        sd[key] = torch.zeros(1)
    elif change == 'mismatched':
        sd[key] = torch.zeros(3, 3)
    else:  # a 1-D tensor of another length (shape[1:] agrees, as for a cluster-count layer)
        key = 'stage1.0.attn.q.bias'
        sd[key] = torch.zeros(5)
    with pytest.raises(CheckpointError, match=f'(?s)beyond the cluster count:.*{key}'):
        adapt_cluster_layers(sd, model)


def test_extract_backbone_prefix():
    """The backbone of a detector/segmentor checkpoint: 'backbone.' by default, any prefix
    with or without its trailing dot, 'module.' (DDP) stripped, non-tensors dropped; a
    prefix no key has is an error that lists the keys."""
    from paca_mm.checkpoint import extract_backbone_state_dict
    w = torch.zeros(1)
    ckpt = {'state_dict': {'module.backbone.a': w, 'backbone.b': w, 'neck.c': w,
                           'backbone.step': 3}}
    assert list(extract_backbone_state_dict(ckpt)) == ['a', 'b']
    assert list(extract_backbone_state_dict(ckpt, prefix='neck')) == ['c']
    assert list(extract_backbone_state_dict(ckpt, prefix='neck.')) == ['c']
    with pytest.raises(CheckpointError, match="no key starts with prefix 'head.'.*backbone.a"):
        extract_backbone_state_dict(ckpt, prefix='head')


def test_key_lists_in_messages_are_capped():
    """Long key lists in load reports show the first 20 and how many more there are."""
    from paca_mm.checkpoint.convert import _fmt
    assert _fmt(range(20)) == '\n    ' + '\n    '.join(map(str, range(20)))
    assert _fmt(range(23)) == '\n    ' + '\n    '.join(map(str, range(20))) + \
        ' ... and 3 more'


def test_missing_tensors_are_missing_not_a_cluster_count_change():
    """Only a stage's clustering tensors, missing as a whole where the checkpoint's stage
    is plain attention, are a cluster-count change: a checkpoint that lacks another tensor
    of a plain (M = 0) stage, or one clustering tensor of a clustered stage, reports it
    missing."""
    from paca_mm.checkpoint import match_state_dict
    model_sd = PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 0)).state_dict()
    sd = dict(model_sd)
    gone = ['stage1.0.attn.clustering.clustering.0.weight', 'stage4.0.attn.q.weight']
    for key in gone:
        del sd[key]
    report = match_state_dict(model_sd, sd)
    assert report['missing'] == gone and report['reinit'] == []
    # the teacher's: a missing BN weight is missing, an extra teacher tensor unexpected
    from paca_mm.checkpoint import load_backbone_checkpoint
    teacher = PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 4), teacher=dict(depths=(1,) * 4))
    model_sd = teacher.state_dict()
    sd = dict(model_sd, **{'paca_teacher.extra.weight': torch.zeros(1)})
    del sd['paca_teacher.block1.0.3.weight']
    report = match_state_dict(model_sd, sd)
    assert report['missing'] == ['paca_teacher.block1.0.3.weight']
    assert report['unexpected'] == ['paca_teacher.extra.weight'] and report['reinit'] == []
    # loading is not strict by default: it reports, strict=True raises
    assert load_backbone_checkpoint(teacher, sd)['missing'] == report['missing']
    with pytest.raises(CheckpointError, match='paca_teacher.block1.0.3.weight'):
        load_backbone_checkpoint(teacher, sd, strict=True)


def test_cluster_count_keys_refuses_a_clustering_module_without_layers():
    """A clustering module with only a buffer (no .weight/.bias) has no known last layer:
    an error that names the key, not a silently shorter set."""
    from paca_mm.checkpoint import cluster_count_keys
    sd = PaCaViT(arch=ARCH, num_clusters=(4, 4, 4, 0)).state_dict()
    block = 'stage1.0.attn.clustering.clustering.'
    orphan = block + '1.running_mean'  # e.g. a BN's buffer kept, its layers' tensors lost
    keys = [k for k in sd if not k.startswith(block)] + [orphan]
    with pytest.raises(ValueError, match=re.escape(orphan) + '.*no .weight/.bias'):
        cluster_count_keys(keys)
    assert block + '4.weight' in cluster_count_keys(sd)
