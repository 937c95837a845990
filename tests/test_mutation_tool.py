"""dev/mutation_test.py: which mutants it makes, and a real run that kills one mutant and
reports another as a survivor."""
import os
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_mutants_of(load_tool):
    tool = load_tool('dev/mutation_test')
    source = ('def f(a, *args, **kw):\n'
              '    """doc: 1 + 2"""\n'
              "    s = 'x + y'  # 3 - 4\n"
              '    for i in range(2):\n'
              '        pass\n'
              '    return a + 1 if a is None else 2.5  # pragma: no mutate\n'
              'y = a is not b or c not in d\n'
              'x = a <= b\n')
    got = [(m.line, m.old, m.new) for m in tool.mutants_of('f.py', source)]
    assert got == [(4, '2', '3'), (7, 'or', 'and'), (8, '<=', '<')]
    assert tool.apply(source, next(iter(tool.mutants_of('f.py', source)))).splitlines()[3] \
        == '    for i in range(3):'


def test_collect_takes_each_file_once(load_tool):
    """A folder and a file inside it (as the default areas name them) give its mutants once."""
    tool = load_tool('dev/mutation_test')
    one = tool.collect(['paca_mm/fileio.py'])
    both = tool.collect(['paca_mm', './paca_mm/fileio.py'])
    names = [str(m) for m in both]
    assert one and len(names) == len(set(names)) and {str(m) for m in one} <= set(names)
    every = [str(m) for m in tool.collect(tool.DEFAULT_FILES)]
    assert len(every) == len(set(every))


def test_fail_first_orders_recent_killers_first(load_tool):
    tool = load_tool('dev/mutation_test')
    items = [SimpleNamespace(nodeid=n) for n in ('a', 'b', 'c', 'd')]
    plugin = tool._FailFirst(['c', 'x', 'b'])
    plugin.pytest_collection_modifyitems(items)
    assert [i.nodeid for i in items] == ['c', 'b', 'a', 'd']
    plugin.pytest_runtest_logreport(SimpleNamespace(failed=False, nodeid='c'))
    plugin.pytest_runtest_logreport(SimpleNamespace(failed=True, nodeid='b'))
    plugin.pytest_runtest_logreport(SimpleNamespace(failed=True, nodeid='a'))
    assert plugin.killer == 'b'


def _spec(path, marker, token):
    """``path:line:col`` of ``token`` in the line of ``path`` that contains ``marker``."""
    with open(osp.join(ROOT, path)) as f:
        for n, line in enumerate(f, 1):
            if marker in line:
                return f'{path}:{n}:{line.index(marker) + marker.index(token) + 1}'
    raise AssertionError(f'{marker!r} not in {path}')


def test_run_kills_and_reports_survivor(tmp_path):
    path = 'paca_mm/models/layers/common.py'
    killed = _spec(path, '[1, 1, 1, 1])', '1')     # the kernel's centre: the shortcut
    # the forward's dropout rescaling: the test's ConvFFN has no dropout, so it never runs
    survivor = _spec(path, 'a = a * mask / (1 - p)', '1')
    node = 'tests/test_memory_efficient_ffn.py::test_keeps_one_hidden_activation'
    report = tmp_path / 'report.txt'
    proc = subprocess.run(
        [sys.executable, 'dev/mutation_test.py', path, '--tests', node, '--jobs', '2',
         '--only', killed, survivor, '--report', str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE='1'))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = report.read_text().splitlines()
    assert len(lines) == 3, lines
    by_spec = {spec: [ln for ln in lines if f' {spec}: ' in ln] for spec in (killed, survivor)}
    assert ' killed ' in by_spec[killed][0] and node in by_spec[killed][0], lines
    assert ' survived ' in by_spec[survivor][0] and "'1' -> '2'" in by_spec[survivor][0]
    assert lines[-1] == ('2 mutants: 1 killed, 0 timed out (counted as killed), '
                         '1 survived')
    assert '--only: no mutant' in subprocess.run(
        [sys.executable, 'dev/mutation_test.py', path, '--only', f'{path}:1'],
        cwd=ROOT, capture_output=True, text=True).stderr
