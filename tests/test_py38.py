"""The code must stay valid Python 3.8 (torch 2.1's oldest Python, setup.py's
``python_requires``): vermin checks every file of paca_mm/, demo/, tools/, configs/, tests/ and
setup.py for syntax, modules, functions and annotations newer than 3.8."""
import os.path as osp
import shutil
import subprocess
import sys

import pytest

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PATHS = ['paca_mm', 'demo', 'tools', 'configs', 'tests', 'setup.py']
# union-types: vermin's heuristic detection of `X | Y` (off by default; no false alarm here)
OPTIONS = ['-t=3.8-', '--no-tips', '--violations', '--eval-annotations', '--no-parse-comments',
           '--feature', 'union-types']


def _vermin(*paths):
    vermin = shutil.which('vermin', path=osp.dirname(sys.executable))  # this environment's
    if vermin is None:
        pytest.fail('vermin is not installed: pip install -r requirements/tests.txt')
    res = subprocess.run([vermin, *OPTIONS, *paths], cwd=ROOT, capture_output=True, text=True)
    # vermin parses with the interpreter it runs on: under Python 3.8 newer syntax (match,
    # parenthesized context managers) is an 'invalid syntax' error with exit status 0, and
    # that is a violation too
    if 'error: invalid syntax' in res.stdout and res.returncode == 0:
        res.returncode = 1
    return res


def test_code_is_python38():
    res = _vermin(*PATHS)
    assert res.returncode == 0, f'newer than Python 3.8:\n{res.stdout}{res.stderr}'


@pytest.mark.parametrize('source, feature', [
    ('def f(x):\n    match x:\n        case 1:\n            return 1\n', 'pattern matching'),
    ('NAME = "v1.0".removeprefix("v")\n', 'str.removeprefix'),
    ('import zoneinfo\n', 'a 3.9 module'),
    ('def f(x: int | None) -> None:\n    pass\n', 'union types'),
    ('with (open("a") as f, open("b") as g):\n    pass\n', 'parenthesized context managers'),
])
def test_newer_code_is_caught(tmp_path, source, feature):
    path = tmp_path / 'newer.py'
    path.write_text(source)
    res = _vermin(str(path))
    assert res.returncode != 0, f'vermin missed {feature}:\n{res.stdout}'
