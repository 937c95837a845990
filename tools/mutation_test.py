"""Mutation testing: plant one small bug at a time and check that the test suite notices.

    python tools/mutation_test.py [FILES...] [--tests T ...] [--limit N] [--seed S]
                                  [--list] [--report FILE]

Each mutant changes one token of one source file, the kind of slip a change could make:
an arithmetic or comparison operator (``+`` ↔ ``-``, ``*`` ↔ ``/``, ``<`` ↔ ``<=``,
``==`` ↔ ``!=`` ...), ``and`` ↔ ``or``, ``True`` ↔ ``False``, ``is`` ↔ ``is not``, or a
numeric literal (an integer plus one, a float times ten). Strings, comments and docstrings
are never touched; a line ending in ``# pragma: no mutate`` is skipped.

For every mutant the repository is copied to a temporary folder (once), the mutated file
written there, and the selected tests run against that copy in a fresh process
(``pytest -x``, so a killed mutant stops at its first failing test). A mutant *survives*
when every test passes. The report lists each survivor with its file, line and change, for
a person to judge: harmless (an equivalent mutant) or a missing test.

Defaults: ``paca_mm/models`` and ``paca_mm/checkpoint.py`` against the model, checkpoint
and spec tests. ``make mutation`` runs it; it is not part of CI (it takes long).
"""
import argparse
import io
import os
import os.path as osp
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tokenize
from typing import Iterator, List, NamedTuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEFAULT_FILES = ['paca_mm/models', 'paca_mm/checkpoint.py']
DEFAULT_TESTS = ['tests/test_spec_pinning.py', 'tests/test_backbone_fixtures.py',
                 'tests/test_backbone.py', 'tests/test_paca_operator.py',
                 'tests/test_paca_head.py', 'tests/test_errors.py',
                 'tests/test_visualization.py']  # it pins record_clusters and its shapes
OPERATORS = {'+': '-', '-': '+', '*': '/', '/': '*', '//': '/', '%': '//', '**': '*',
             '<': '<=', '<=': '<', '>': '>=', '>=': '>', '==': '!=', '!=': '==',
             '+=': '-=', '-=': '+=', '*=': '/=', '/=': '*=', '@': '*'}
NAMES = {'and': 'or', 'or': 'and', 'True': 'False', 'False': 'True', 'is': 'is not',
         'in': 'not in'}


class Mutant(NamedTuple):
    path: str       # relative to the repository root
    line: int
    col: int
    old: str
    new: str

    def __str__(self):
        return f'{self.path}:{self.line}:{self.col + 1}: {self.old!r} -> {self.new!r}'


def _number(text: str) -> str:
    value = text.replace('_', '')
    if value.lower().startswith(('0x', '0o', '0b')) or value.endswith(('j', 'J')):
        return ''
    if any(c in value for c in '.eE'):
        return repr(float(value) * 10)
    return str(int(value) + 1)


def mutants_of(path: str, source: str) -> Iterator[Mutant]:
    """Every one-token mutant of ``source`` (``path`` names it in the result)."""
    lines = source.splitlines()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        (row, col), text = tok.start, tok.string
        if row > len(lines) or lines[row - 1].rstrip().endswith('# pragma: no mutate'):
            continue
        new = ''
        prev = tokens[i - 1].string if i else ''
        if tok.type == tokenize.OP and text in OPERATORS:
            if text in ('*', '**') and prev in ('(', ',', '[', '{', '=', 'lambda'):
                continue  # *args / **kwargs / a keyword-only marker, not arithmetic
            new = OPERATORS[text]
        elif tok.type == tokenize.NAME and text in NAMES:
            if text == 'in' and prev == 'not' or \
                    text == 'is' and tokens[i + 1].string == 'not':
                continue
            if text == 'in' and any(t.string == 'for' for t in tokens[max(0, i - 12):i]
                                    if t.start[0] == row):
                continue  # the 'in' of a for loop / comprehension
            new = NAMES[text]
        elif tok.type == tokenize.NUMBER:
            new = _number(text)
        if new:
            yield Mutant(path, row, col, text, new)


def apply(source: str, m: Mutant) -> str:
    lines = source.splitlines(keepends=True)
    line = lines[m.line - 1]
    assert line[m.col:m.col + len(m.old)] == m.old, (m, line)
    lines[m.line - 1] = line[:m.col] + m.new + line[m.col + len(m.old):]
    return ''.join(lines)


def collect(targets: List[str]) -> List[Mutant]:
    files = []
    for t in targets:
        full = osp.join(ROOT, t)
        if osp.isdir(full):
            for base, _, names in sorted(os.walk(full)):
                files += [osp.relpath(osp.join(base, n), ROOT) for n in sorted(names)
                          if n.endswith('.py')]
        elif osp.isfile(full):
            files.append(t)
        else:
            raise SystemExit(f'error: {t} is neither a file nor a folder of the repository')
    out = []
    for f in files:
        with open(osp.join(ROOT, f)) as fh:
            out += list(mutants_of(f, fh.read()))
    return out


def _copy_repo(dst: str) -> None:
    ignore = shutil.ignore_patterns('.git', '.venv*', 'work_dirs', '__pycache__', '*.pyc',
                                    '.mim', 'build', '*.egg-info')
    shutil.copytree(ROOT, dst, ignore=ignore)


def run_tests(repo: str, tests: List[str], timeout: float) -> str:
    """'killed', 'survived' or 'timeout' (a timeout counts as killed: the mutant hangs)."""
    env = dict(os.environ, PYTHONPATH=repo, OMP_NUM_THREADS='1', PYTHONDONTWRITEBYTECODE='1')
    # the copy lies outside the checkout: point the fixture tests at the checkout's fixtures
    env.setdefault('PACA_FIXTURES', osp.join(osp.dirname(ROOT), 'shared', 'reference',
                                             'fixtures'))
    cmd = [sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider',
           '-m', 'not slow'] + tests
    try:
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return 'timeout'
    if proc.returncode == 0:
        return 'survived'
    if proc.returncode in (1, 3):  # test failures / internal error from the mutant
        return 'killed'
    raise RuntimeError(f'pytest exited with {proc.returncode} (usage error?):\n'
                       + proc.stdout[-2000:] + proc.stderr[-2000:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('files', nargs='*', default=DEFAULT_FILES,
                   help=f'files or folders to mutate (default: {" ".join(DEFAULT_FILES)})')
    p.add_argument('--tests', nargs='+', default=DEFAULT_TESTS, help='test files to run')
    p.add_argument('--limit', type=int, default=0,
                   help='test a random sample of this many mutants (0 = all)')
    p.add_argument('--seed', type=int, default=0, help='seed of the sample')
    p.add_argument('--timeout', type=float, default=900, help='seconds per mutant')
    p.add_argument('--list', action='store_true', help='only list the mutants')
    p.add_argument('--report', help='also write the report to this file')
    args = p.parse_args(argv)

    mutants = collect(args.files)
    if args.limit and args.limit < len(mutants):
        mutants = sorted(random.Random(args.seed).sample(mutants, args.limit))
    if args.list:
        print('\n'.join(map(str, mutants)))
        return 0
    lines = []
    with tempfile.TemporaryDirectory(prefix='paca_mutation_') as tmp:
        repo = osp.join(tmp, 'repo')
        _copy_repo(repo)
        if run_tests(repo, args.tests, args.timeout) != 'survived':
            raise SystemExit('error: the tests fail on the unmutated code; fix them first')
        counts = {'killed': 0, 'survived': 0, 'timeout': 0}
        for n, m in enumerate(mutants, 1):
            src_path = osp.join(repo, m.path)
            with open(src_path) as f:
                original = f.read()
            with open(src_path, 'w') as f:
                f.write(apply(original, m))
            t = time.time()
            try:
                result = run_tests(repo, args.tests, args.timeout)
            finally:
                with open(src_path, 'w') as f:
                    f.write(original)
            counts[result] += 1
            line = f'[{n}/{len(mutants)}] {result:8s} {m}  ({time.time() - t:.0f} s)'
            print(line, flush=True)
            lines.append(line)
    summary = (f'{len(mutants)} mutants: {counts["killed"]} killed, {counts["timeout"]} '
               f'timed out (counted as killed), {counts["survived"]} survived')
    print(summary)
    survivors = [ln for ln in lines if ' survived ' in ln]
    if survivors:
        print('survivors:\n  ' + '\n  '.join(survivors))
    if args.report:
        os.makedirs(osp.dirname(osp.abspath(args.report)), exist_ok=True)
        with open(args.report, 'w') as f:
            f.write('\n'.join(lines + [summary]) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
