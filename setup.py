import os
import os.path as osp
import shutil
import sys
import warnings

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))
# What `mim` (openmim) reads from an installed package: `mim search` the model index,
# `mim train` / `mim test` the tools and configs, all under paca_mm/.mim.
MIM_FILES = ('configs', 'tools', 'model-index.yml')


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


def add_mim_extension():
    """Put configs/, tools/ and model-index.yml into paca_mm/.mim, as mmdet and mmseg do.

    An editable install (``pip install -e .``) links them, so edits show at once; a wheel or
    sdist build (``pip install .``, ``python -m build``) copies them, so the installed
    package carries them (MANIFEST.in and ``include_package_data`` add them to the
    distribution). Other setup.py commands (egg_info, ...) leave paca_mm/.mim alone.
    """
    if 'develop' in sys.argv or 'editable_wheel' in sys.argv:
        mode = 'symlink'
    elif 'sdist' in sys.argv or 'bdist_wheel' in sys.argv:
        mode = 'copy'
    else:
        return
    mim_path = osp.join(HERE, 'paca_mm', '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for name in MIM_FILES:
        src = osp.join(HERE, name)
        dst = osp.join(mim_path, name)
        if not osp.exists(src):
            raise FileNotFoundError(f'{src} is missing: paca_mm/.mim needs {", ".join(MIM_FILES)}')
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        if mode == 'symlink':
            try:
                os.symlink(osp.relpath(src, mim_path), dst)
                continue
            except OSError:  # e.g. Windows without the symlink privilege
                warnings.warn(f'could not link {dst} to {src}; copying it instead')
        if osp.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        else:
            shutil.copyfile(src, dst)


add_mim_extension()

setup(
    name='paca_mm',
    version=get_version(),
    description='PaCa-ViT (Patch-to-Cluster Attention, CVPR 2023) for '
    'mmpretrain, mmdetection and mmsegmentation',
    long_description=open(osp.join(HERE, 'README.md')).read()
    if osp.exists(osp.join(HERE, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(include=['paca_mm', 'paca_mm.*']),
    include_package_data=True,  # paca_mm/.mim (listed in MANIFEST.in)
    python_requires='>=3.8',
    install_requires=read_requirements('runtime.txt'),
    extras_require={'tests': read_requirements('tests.txt'),
                    'deploy': read_requirements('deploy.txt')},
    license='Apache-2.0',
    classifiers=[
        'License :: OSI Approved :: Apache Software License',
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3.8',
        'Programming Language :: Python :: 3.9',
        'Programming Language :: Python :: 3.10',
        'Programming Language :: Python :: 3.11',
    ],
    zip_safe=False,
)
