"""The OpenMMLab model-zoo layer: metafiles, model-index.yml, folder READMEs, the packaging of
configs/tools/index into paca_mm/.mim, and `mim search` and models by name on a non-editable
install."""
import copy
import glob
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
import yaml
from mmengine.config import Config

import paca_mm  # noqa: F401

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
METAFILES = sorted(glob.glob(osp.join(ROOT, 'configs', '*', 'metafile.yml')))
# config folders that are not model-zoo entries
NOT_ZOO = {'_base_'}


def _load(path):
    with open(path) as f:
        return yaml.safe_load(f)


def _models():
    """(metafile path, model entry) for every model of every metafile."""
    return [(path, model) for path in METAFILES for model in _load(path)['Models']]


MODELS = _models()


def _zoo_configs():
    folders = [d for d in sorted(os.listdir(osp.join(ROOT, 'configs')))
               if osp.isdir(osp.join(ROOT, 'configs', d)) and d not in NOT_ZOO]
    return {osp.relpath(p, ROOT) for d in folders
            for p in glob.glob(osp.join(ROOT, 'configs', d, '*.py'))}


def test_every_config_is_in_exactly_one_metafile_and_back():
    listed = [m['Config'] for _, m in MODELS]
    assert len(listed) == len(set(listed)), 'a config is listed twice'
    assert set(listed) == _zoo_configs(), set(listed) ^ _zoo_configs()
    for path, model in MODELS:  # a metafile lists only the configs of its own folder
        assert osp.dirname(model['Config']) == osp.relpath(osp.dirname(path), ROOT), model['Name']
    names = [m['Name'] for _, m in MODELS]
    assert len(names) == len(set(names))
    # the name is the config's stem, so `mim download paca_mm --config NAME` finds it
    assert all(m['Name'] == osp.basename(m['Config'])[:-3] for _, m in MODELS)


def test_model_index_imports_every_metafile():
    index = _load(osp.join(ROOT, 'model-index.yml'))
    assert sorted(index['Import']) == sorted(osp.relpath(p, ROOT) for p in METAFILES)
    assert {osp.basename(osp.dirname(p)) for p in METAFILES} == \
        {osp.basename(osp.dirname(c)) for c in _zoo_configs()}


@pytest.mark.parametrize('path', METAFILES, ids=lambda p: osp.basename(osp.dirname(p)))
def test_metafile_fields(path):
    meta = _load(path)
    (collection, ) = meta['Collections']
    assert osp.isfile(osp.join(ROOT, collection['README']))
    assert collection['Paper']['URL'] == 'https://arxiv.org/abs/2203.11987'
    # the published results are labelled as the paper's, not ours
    assert 'not reproduced' in collection['Description']
    with open(path) as f:
        assert 'NOT reproduced here' in f.read()
    for model in meta['Models']:
        assert model['In Collection'] == collection['Name']
        md = model['Metadata']
        assert isinstance(md['Parameters'], int) and isinstance(md['FLOPs'], int)
        assert md['Training Data'] == collection['Metadata']['Training Data']
        for result in model.get('Results', []):
            assert result['Dataset'] == md['Training Data']
            assert all(0 < v < 100 for v in result['Metrics'].values())
        release = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'
        if 'Converted From' in model:
            assert model['Converted From']['Weights'].startswith(release)
            assert model['Converted From']['Code'] == 'https://github.com/iVMCL/PaCaViT'
        if 'Weights' in model:
            assert model['Weights'] == model['Converted From']['Weights']
    # only the models of the official repository outside the paper lack published results
    no_results = {m['Name'] for m in meta['Models'] if not m.get('Results')}
    assert all('convmixer_tiny' in n for n in no_results), no_results


def _build(config):
    """cfg.model of a config without its checkpoint, SyncBN -> BN (parameter counts only)."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import MODELS as ROOT_MODELS
    from mmengine.registry import init_default_scope

    from paca_mm.registry import register_toolbox_modules
    cfg = Config.fromfile(osp.join(ROOT, config))
    init_default_scope(register_toolbox_modules(cfg))
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.pop('init_cfg', None)
    return revert_sync_batchnorm(ROOT_MODELS.build(model_cfg))


@pytest.mark.parametrize('model', [m for _, m in MODELS], ids=lambda m: m['Name'])
def test_metafile_parameters_match_the_built_model(model):
    built = _build(model['Config'])
    assert sum(p.numel() for p in built.parameters()) == model['Metadata']['Parameters']


@pytest.mark.parametrize('name', ['pacahead_pacavit_convmixer_tiny_100_512x512_160k_ade20k',
                                  'pacavit_tiny_p2cconv_100_0_8xb128_in1k'])
def test_metafile_flops_are_what_get_flops_measures(name, load_tool):
    """Spot check (the detectors take ~30 s each): the metafile FLOPs are tools/get_flops.py's."""
    get_flops = load_tool('get_flops')
    (model, ) = [m for _, m in MODELS if m['Name'] == name]
    with torch.no_grad():
        res = get_flops.measure(config=osp.join(ROOT, model['Config']))
    assert res['flops'] == model['Metadata']['FLOPs']
    assert res['params'] == model['Metadata']['Parameters']


@pytest.mark.parametrize('path', METAFILES, ids=lambda p: osp.basename(osp.dirname(p)))
def test_folder_readme(path):
    folder = osp.dirname(path)
    with open(osp.join(folder, 'README.md')) as f:
        text = f.read()
    for model in _load(path)['Models']:
        assert f"({osp.basename(model['Config'])})" in text, model['Config']  # a link
    for usage in ('tools/dist_train.sh', 'tools/slurm_train.sh', 'mim train paca_mm',
                  'mim test paca_mm', 'metafile.yml', 'docs/differences.md'):
        assert usage in text, usage
    assert 'not reproduced here' in ' '.join(text.split())  # line breaks aside


def test_license_and_citation():
    with open(osp.join(ROOT, 'setup.py')) as f:
        assert "license='Apache-2.0'" in f.read()
    with open(osp.join(ROOT, 'LICENSE')) as f:
        text = f.read()
    assert text.split('\n')[0].strip() == 'Apache License'
    assert 'Version 2.0, January 2004' in text and 'END OF TERMS AND CONDITIONS' in text
    cff = _load(osp.join(ROOT, 'CITATION.cff'))
    assert cff['cff-version'].startswith('1.2')
    assert cff['preferred-citation']['title'] == \
        'PaCa-ViT: Learning Patch-to-Cluster Attention in Vision Transformers'
    with open(osp.join(ROOT, 'README.md')) as f:
        readme = f.read()
    assert '@inproceedings{Grainger2023PaCaViT' in readme and 'docs/differences.md' in readme


def _run(cmd, **kwargs):
    """stdout of cmd (stderr only in the failure message: mim and pkg_resources warn there)."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300, **kwargs)
    assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}'
    return proc.stdout


def test_install_carries_the_model_zoo_and_mim_search_lists_every_model(installed_paca_mm,
                                                                       tmp_path):
    """The non-editable install of the checkout (a throwaway target directory, see
    tests/conftest.py) carries the model zoo, and `mim search paca_mm` against it lists it."""
    pytest.importorskip('mim', reason='openmim is in requirements/tests.txt')
    target = installed_paca_mm
    mim_dir = target / 'paca_mm' / '.mim'
    assert (mim_dir / 'tools' / 'train.py').is_file() and (mim_dir / 'tools' / 'test.py').is_file()
    for _, model in MODELS:
        assert (mim_dir / model['Config']).is_file(), model['Config']
    env = dict(os.environ, PYTHONPATH=str(target))
    # models by name come from the installed copy: mmpretrain's ModelHub and resolve_model
    where = _run([sys.executable, '-c', 'import paca_mm; from mim.utils import '
                  'get_installed_path; print(paca_mm.__file__); '
                  'print(get_installed_path("paca_mm")); import mmpretrain; '
                  'print(len(mmpretrain.list_models("*paca*"))); '
                  'print(mmpretrain.apis.ModelHub.get("pacavit_tiny_p2cconv_100_0_8xb128_in1k")'
                  '.config.filename); from paca_mm.apis import resolve_model; '
                  'print(resolve_model("upernet_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k")'
                  '[0])'], env=env, cwd=str(tmp_path))
    assert where.split() == [
        str(target / 'paca_mm' / '__init__.py'), str(target / 'paca_mm'), '13',
        str(mim_dir / 'configs' / 'paca_vit_imagenet' /
            'pacavit_tiny_p2cconv_100_0_8xb128_in1k.py'),
        str(mim_dir / 'configs' / 'upernet' /
            'upernet_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k.py')]
    out = _run([sys.executable, '-m', 'mim', 'search', 'paca_mm'], env=env, cwd=str(tmp_path))
    listed = {line.split(':', 1)[1].strip() for line in out.splitlines()
              if line.startswith('config id:')}
    assert listed == {m['Name'] for _, m in MODELS}
