import glob
import os
import os.path as osp
import sys

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def read_requirements(name):
    """Requirement lines of requirements/<name>.txt, without comments."""
    lines = []
    with open(osp.join(HERE, 'requirements', name)) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line:
                lines.append(line)
    return lines


def get_version():
    scope = {}
    with open(osp.join(HERE, 'paca_mm', 'version.py')) as f:
        exec(f.read(), scope)
    return scope['__version__']


def ext_modules():
    """The compiled CPU ops (paca_mm/ops/csrc). They need torch at build time (install with
    ``pip install --no-build-isolation``); without torch, or with PACA_MM_NO_OPS=1, paca_mm
    installs without them and uses the slower pure-ATen paths (paca_mm.ops.status() says why)."""
    if os.environ.get('PACA_MM_NO_OPS', '0') == '1':
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print('paca_mm: torch is not importable at build time; building without the '
              'compiled CPU op (use pip install --no-build-isolation)', file=sys.stderr)
        return [], {}
    ext = CppExtension(
        'paca_mm._ops', sorted(glob.glob('paca_mm/ops/csrc/*.cpp')),
        extra_compile_args=['-O3', '-fopenmp', '-Wno-psabi'], extra_link_args=['-fopenmp'])
    return [ext], {'build_ext': BuildExtension.with_options(use_ninja=False)}


EXT_MODULES, CMDCLASS = ext_modules()

setup(
    name='paca_mm',
    version=get_version(),
    description='PaCa-ViT (Patch-to-Cluster Attention, CVPR 2023) for '
    'mmpretrain, mmdetection and mmsegmentation',
    long_description=open(osp.join(HERE, 'README.md')).read()
    if osp.exists(osp.join(HERE, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['paca_mm', 'paca_mm.*']),
    python_requires='>=3.8',
    install_requires=read_requirements('runtime.txt'),
    extras_require={'tests': read_requirements('tests.txt')},
    license='Apache-2.0',
    zip_safe=False,
    ext_modules=EXT_MODULES,
    cmdclass=CMDCLASS,
)
