"""Mutation testing: plant one small bug at a time and check that the test suite notices.

    python dev/mutation_test.py [FILES...] [--tests T ...] [--limit N] [--seed S]
                                  [--only PATH:LINE[:COL] ...] [--jobs J] [--list]
                                  [--report FILE]

Each mutant changes one token of one source file, the kind of slip a change could make:
an arithmetic or comparison operator (``+`` ↔ ``-``, ``*`` ↔ ``/``, ``<`` ↔ ``<=``,
``==`` ↔ ``!=`` ...), ``and`` ↔ ``or``, ``True`` ↔ ``False``, ``is`` ↔ ``is not``, or a
numeric literal (an integer plus one, a float times ten). Strings, comments and docstrings
are never touched; a line ending in ``# pragma: no mutate`` is skipped.

The repository is copied to a temporary folder once per job (``--jobs``, default: one per
CPU). For every mutant the mutated file is written into a copy, and the selected tests run
against it in a child process forked from this one, which has already imported torch and
the OpenMMLab toolboxes (never paca_mm): ``pytest -x``, so a killed mutant stops at its first
failing test, and the tests that killed recent mutants run first. A mutant *survives*
when every test passes. The report lists each survivor with its file, line and change, for
a person to judge: harmless (an equivalent mutant) or a missing test.

Defaults: the models, checkpoint handling, Runner additions (``paca_mm/engine``), hooks,
registry, file writing, FLOP handles, deployment, visualisation and ``tools/train.py`` /
``tools/test.py``, each against the fast tests of its area (``AREAS``). ``make mutation`` runs it; it is not part of CI (it takes long).
"""
import argparse
import io
import os
import os.path as osp
import random
import shutil
import sys
import tempfile
import time
import tokenize
from typing import Iterator, List, NamedTuple, Optional

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
_MODEL_TESTS = ['tests/test_spec_pinning.py', 'tests/test_backbone_fixtures.py',
                'tests/test_backbone.py', 'tests/test_paca_operator.py',
                'tests/test_paca_head.py', 'tests/test_errors.py',
                'tests/test_pinned_behaviour.py',
                'tests/test_visualization.py',  # it pins record_clusters and its shapes
                'tests/test_memory_efficient_ffn.py', 'tests/test_checkpoint_safety.py',
                'tests/test_atomic_checkpoints.py', 'tests/test_deployment.py']
_RUNNER_TESTS = ['tests/test_tools.py', 'tests/test_pinned_behaviour.py',
                 'tests/test_atomic_checkpoints.py', 'tests/test_checkpoint_safety.py',
                 'tests/test_compile.py', 'tests/test_errors.py']
# What each part of the code is tested by: a mutant runs the (fast) tests of the first
# entry whose path prefix its file has. Without --tests, the default run covers them all.
AREAS = [
    ('paca_mm/models/test_time_augs', ['tests/test_tta.py']),
    ('paca_mm/models', _MODEL_TESTS),
    ('paca_mm/checkpoint', _MODEL_TESTS + ['tests/test_weights_by_url.py']),
    ('paca_mm/engine', _RUNNER_TESTS + ['tests/test_tta.py']),
    ('paca_mm/hooks', _RUNNER_TESTS + ['tests/test_visualization.py']),
    ('paca_mm/registry.py', _RUNNER_TESTS),
    ('paca_mm/fileio.py', _RUNNER_TESTS + ['tests/test_visualization.py']),
    ('paca_mm/flops.py', ['tests/test_flops.py', 'tests/test_stock_flops.py']),
    ('paca_mm/deployment.py', ['tests/test_deployment.py']),
    ('paca_mm/visualization', ['tests/test_visualization.py', 'tests/test_drawing.py',
                               'tests/test_image_demo.py',
                               'tests/test_checkpoint_safety.py']),
    ('tools/train.py', _RUNNER_TESTS),
    ('tools/test.py', _RUNNER_TESTS),
]
DEFAULT_FILES = [prefix for prefix, _ in AREAS]


def tests_for(path: str) -> List[str]:
    """The tests of the area of ``path`` (see AREAS); the model tests outside them."""
    for prefix, tests in AREAS:
        if path == prefix or path.startswith(prefix.rstrip('/') + '/'):
            return tests
    return _MODEL_TESTS


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
        return repr(float(value) * 10 or 1.)  # 0. -> 1.0: ten times 0 is no change
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
    for f in dict.fromkeys(osp.normpath(f) for f in files):  # a file once, however named
        with open(osp.join(ROOT, f)) as fh:
            out += list(mutants_of(f, fh.read()))
    return out


def _copy_repo(dst: str) -> None:
    ignore = shutil.ignore_patterns('.git', '.venv*', 'work_dirs', '__pycache__', '*.pyc',
                                    '.mim', 'build', '*.egg-info')
    shutil.copytree(ROOT, dst, ignore=ignore)


# Third-party modules that the tests import. This process imports them once; each mutant's
# tests then run in a child forked from it, which starts with them loaded: a fresh
# interpreter would spend most of a killed mutant's time importing them. paca_mm itself is
# never imported here, so every child imports the mutated copy.
PRELOAD = ('numpy', 'torch', 'torchvision', 'pytest', 'mmengine.runner', 'mmcv.cnn',
           'mmdet.models', 'mmseg.models', 'mmpretrain.models')
KILLERS_KEPT = 40  # how many recently killing tests run first


class _FailFirst:
    """pytest plugin of a child: the tests that killed recent mutants run first (most
    recent first; the rest keep their order), and the first failing test is recorded."""

    def __init__(self, first: List[str]):
        self.rank = {node: i for i, node in enumerate(first)}
        self.killer = ''

    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: self.rank.get(item.nodeid, len(self.rank)))

    def pytest_runtest_logreport(self, report):
        if report.failed and not self.killer:
            self.killer = report.nodeid


def _run_child(repo: str, tests: List[str], first: List[str], log: str, pipe: int) -> None:
    """In the forked child: run the tests on ``repo`` and exit with pytest's status."""
    import pytest
    os.setpgid(0, 0)  # the parent kills the whole group on a timeout
    out = open(log, 'w')  # stays open until os._exit
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    status = 4
    try:
        sys.dont_write_bytecode = True  # a mutant of the same size and mtime second
        os.chdir(repo)                  # must not be served from a stale .pyc
        sys.path.insert(0, repo)
        plugin = _FailFirst(first)
        status = int(pytest.main(['-x', '-q', '-p', 'no:cacheprovider', '-m', 'not slow']
                                 + tests, plugins=[plugin]))
        module = sys.modules.get('paca_mm')
        if module is not None and not osp.abspath(module.__file__).startswith(repo + os.sep):
            print(f'the tests imported paca_mm from {module.__file__}, not from the mutated '
                  f'copy {repo}')
            status = 4
        os.write(pipe, plugin.killer.encode())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


class _Slot:
    """One worker: its own copy of the repository, and the child running in it."""

    def __init__(self, tmp: str, index: int):
        self.repo = osp.join(tmp, f'repo{index}')
        self.log = osp.join(tmp, f'pytest{index}.log')
        _copy_repo(self.repo)
        self.pid = 0

    def start(self, tests: List[str], first: List[str], mutant=None) -> None:
        self.mutant, self.original = mutant, None
        if mutant is not None:
            path = osp.join(self.repo, mutant.path)
            with open(path) as f:
                self.original = f.read()
            with open(path, 'w') as f:
                f.write(apply(self.original, mutant))
        self.read, write = os.pipe()
        self.started = time.time()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.read)
            _run_child(self.repo, tests, first, self.log, write)
        os.close(write)

    def poll(self, timeout: float):
        """None while the child runs; else (result, killing test, seconds)."""
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        seconds = time.time() - self.started
        if pid == 0 and seconds <= timeout:
            return None
        if pid == 0:  # a mutant that hangs counts as killed
            os.killpg(self.pid, 9)
            os.waitpid(self.pid, 0)
            result = 'timeout'
        else:
            code = (os.WEXITSTATUS(status) if os.WIFEXITED(status)
                    else -os.WTERMSIG(status))
            if code == 0:
                result = 'survived'
            elif code in (1, 2, 3) or code < 0:  # failures, a collection (import) error,
                result = 'killed'                # pytest's internal error, a crash
            else:
                with open(self.log) as f:
                    raise RuntimeError(f'pytest exited with {code} (usage error?):\n'
                                       + f.read()[-3000:])
        with os.fdopen(self.read) as f:
            killer = f.read()
        if self.mutant is not None:
            with open(osp.join(self.repo, self.mutant.path), 'w') as f:
                f.write(self.original)
        self.pid = 0
        return result, killer, seconds


def run_mutants(mutants: List[Mutant], tests: Optional[List[str]], jobs: int,
                timeout: float, report=None) -> dict:
    """Test every mutant against ``tests`` (None: the tests of its area, :func:`tests_for`),
    ``jobs`` at a time; print (and append to ``report``) one line each. Returns the counts
    of 'killed', 'survived' and 'timeout'."""
    # PACA_MM_FIXTURE_LANE=0: no background fixture builds (tests/conftest.py) that `-x`
    # would throw away, and the killers-first test order is kept
    os.environ.update(OMP_NUM_THREADS='1', PACA_MM_TEST_THREADS='1',
                      PYTHONDONTWRITEBYTECODE='1', PACA_MM_FIXTURE_LANE='0')
    for name in PRELOAD:
        __import__(name)
    counts = {'killed': 0, 'survived': 0, 'timeout': 0}
    killers: List[str] = []
    with tempfile.TemporaryDirectory(prefix='paca_mutation_') as tmp:
        slots = [_Slot(tmp, i) for i in range(max(1, min(jobs, len(mutants))))]
        os.environ['PYTHONPATH'] = slots[0].repo  # for tests that start subprocesses
        every = tests or sorted({t for m in mutants for t in tests_for(m.path)})
        slots[0].start(every, [])
        while (done := slots[0].poll(timeout)) is None:
            time.sleep(0.2)
        if done[0] != 'survived':
            with open(slots[0].log) as f:
                raise SystemExit('error: the tests fail on the unmutated code; fix them '
                                 'first:\n' + f.read()[-3000:])
        print(f'unmutated code: the tests pass in {done[2]:.0f} s; {len(mutants)} mutants, '
              f'{len(slots)} at a time', flush=True)
        todo, n = list(mutants), 0
        while todo or any(s.pid for s in slots):
            for slot in slots:
                if slot.pid:
                    done = slot.poll(timeout)
                    if done is None:
                        continue
                    result, killer, seconds = done
                    counts[result] += 1
                    n += 1
                    if killer:
                        killers = [killer] + [k for k in killers if k != killer]
                        del killers[KILLERS_KEPT:]
                    line = (f'[{n}/{len(mutants)}] {result:8s} {slot.mutant}  ({seconds:.0f} s'
                            + (f', {killer}' if killer else '') + ')')
                    print(line, flush=True)
                    if report:
                        with open(report, 'a') as f:
                            f.write(line + '\n')
                if todo:
                    os.environ['PYTHONPATH'] = slot.repo
                    mutant = todo.pop(0)
                    slot.start(tests or tests_for(mutant.path), killers, mutant)
            time.sleep(0.1)
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('files', nargs='*', default=DEFAULT_FILES,
                   help=f'files or folders to mutate (default: {" ".join(DEFAULT_FILES)})')
    p.add_argument('--tests', nargs='+',
                   help='test files (or node ids) to run for every mutant (default: the '
                        'tests of its area, AREAS in this file)')
    p.add_argument('--limit', type=int, default=0,
                   help='test a random sample of this many mutants (0 = all)')
    p.add_argument('--seed', type=int, default=0, help='seed of the sample')
    p.add_argument('--only', nargs='+', metavar='PATH:LINE[:COL]',
                   help='test only these mutants, named as --list names them (e.g. to rerun '
                        'a survivor)')
    p.add_argument('--jobs', type=int, default=os.cpu_count() or 1,
                   help='mutants tested at a time, one thread each (default: the CPU count)')
    p.add_argument('--timeout', type=float, default=900, help='seconds per mutant')
    p.add_argument('--list', action='store_true', help='only list the mutants')
    p.add_argument('--report', help='also write the lines to this file (as they come)')
    p.add_argument('--resume', action='store_true',
                   help='keep the lines already in --report and test only the mutants it '
                        'does not list yet (a run that was cut off goes on)')
    args = p.parse_args(argv)
    if args.jobs < 1 or args.limit < 0 or args.timeout <= 0:
        p.error('--jobs must be >= 1, --limit >= 0 and --timeout > 0')

    mutants = collect(args.files)
    if args.only:
        picked = [m for m in mutants if any(f'{str(m)}'.startswith(spec + ':')
                                            for spec in args.only)]
        missing = [spec for spec in args.only
                   if not any(str(m).startswith(spec + ':') for m in picked)]
        if missing:
            p.error(f'--only: no mutant at {", ".join(missing)} (see --list)')
        mutants = picked
    if args.limit and args.limit < len(mutants):
        mutants = sorted(random.Random(args.seed).sample(mutants, args.limit))
    if args.list:
        print('\n'.join(map(str, mutants)))
        return 0
    if args.resume and not args.report:
        p.error('--resume needs --report (the report of the run that goes on)')
    counts = {'killed': 0, 'survived': 0, 'timeout': 0}
    if args.resume and osp.exists(args.report):
        with open(args.report) as f:
            kept = [ln for ln in f.read().splitlines() if ln.startswith('[')]
        done = {str(m): m for m in mutants}
        for ln in kept:  # '[n/N] result   path:line:col: 'old' -> 'new'  (...)'
            result, rest = ln.split('] ', 1)[1].split(None, 1)
            name = rest.rsplit('  (', 1)[0]
            if name not in done:
                p.error(f'--resume: {args.report} lists {name}, which is not a mutant of '
                        'this run (the code or the arguments changed): start a new report')
            counts[result] += 1
            del done[name]
        mutants = [m for m in mutants if str(m) in done]
        with open(args.report, 'w') as f:  # without the old summary line
            f.write(''.join(ln + '\n' for ln in kept))
        print(f'--resume: {len(kept)} mutants already in {args.report}, {len(mutants)} to go')
    elif args.report:
        os.makedirs(osp.dirname(osp.abspath(args.report)), exist_ok=True)
        open(args.report, 'w').close()
    for key, value in run_mutants(mutants, args.tests, args.jobs, args.timeout,
                                  args.report).items():
        counts[key] += value
    summary = (f'{sum(counts.values())} mutants: {counts["killed"]} killed, {counts["timeout"]} '
               f'timed out (counted as killed), {counts["survived"]} survived')
    print(summary)
    if args.report:
        with open(args.report, 'a') as f:
            f.write(summary + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
