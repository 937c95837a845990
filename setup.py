import os.path as osp

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
)
