#!/usr/bin/env python
"""Speed-accuracy chart and table from ``dev/zoo_benchmark.py``'s JSON files.

One panel per task and timed part/engine: the published accuracy (read from the metafiles
by the benchmark) against the measured latency, one labelled point per model, the
speed-accuracy front drawn as a step line. A model is on the front when no other model of
the panel is at least as accurate and faster; otherwise its *gap* is its latency divided by
that of the fastest model at least as accurate (how much faster it would have to be to
join the front).

Example::

    python dev/zoo_chart.py docs/benchmark_latest/zoo_seg.json \\
        docs/benchmark_latest/zoo_det.json --png docs/zoo_speed_accuracy.png \\
        --markdown docs/benchmark_latest/zoo.md
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

METRIC = {'seg': 'mIoU', 'det': 'box AP'}
TITLES = {'seg': 'ADE20k 512x512 (mIoU)', 'det': 'COCO 800x1333 (box AP)'}


def load(paths):
    records, settings = [], []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        records += data['records']
        settings.append(data['settings'])
    return records, settings


def panels(records):
    """{(task, part, engine): [(model, latency ms, accuracy)]} (measured points only)."""
    out = {}
    for r in records:
        for part, engines in r['ms'].items():
            for engine, ms in engines.items():
                out.setdefault((r['task'], part, engine), []).append(
                    (r['model'], ms, r['published'][METRIC[r['task']]]))
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0] != 'seg', kv[0][1] == 'predict',
                                                    kv[0][2])))


def front_gaps(points):
    """{model: 1.0 on the front, else latency / latency of the fastest model at least as
    accurate}."""
    gaps = {}
    for name, ms, acc in points:
        better = [m for n, m, a in points if n != name and a >= acc and m < ms]
        gaps[name] = ms / min(better) if better else 1.0
    return gaps


def plot(records, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    groups = panels(records)
    cols = max(sum(1 for k in groups if k[0] == t) for t in ('seg', 'det') if any(
        k[0] == t for k in groups))
    tasks = [t for t in ('seg', 'det') if any(k[0] == t for k in groups)]
    fig, axes = plt.subplots(len(tasks), cols, figsize=(4.2 * cols, 3.8 * len(tasks)),
                             squeeze=False)
    for row, task in enumerate(tasks):
        keys = [k for k in groups if k[0] == task]
        for col in range(cols):
            ax = axes[row][col]
            if col >= len(keys):
                ax.axis('off')
                continue
            _, part, engine = keys[col]
            points = groups[keys[col]]
            gaps = front_gaps(points)
            front = sorted((m, a) for n, m, a in points if gaps[n] == 1.0)
            ax.step([m for m, _ in front], [a for _, a in front], where='post', color='0.6',
                    lw=1, zorder=1)
            for name, ms, acc in points:
                paca = name.startswith('PaCa')
                ax.scatter(ms, acc, s=30, zorder=2, color='C3' if paca else 'C0',
                           marker='*' if paca else 'o')
                ax.annotate(name, (ms, acc), fontsize=7, xytext=(3, 3),
                            textcoords='offset points')
            ax.set_title(f'{TITLES[task]}\n{part}, {engine}', fontsize=9)
            ax.set_xlabel('latency (ms, batch 1)', fontsize=8)
            ax.set_ylabel(f'published {METRIC[task]}', fontsize=8)
            ax.tick_params(labelsize=7)
            ax.margins(x=0.25, y=0.12)
            ax.grid(alpha=.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(records, settings):
    """One table per task: accuracy, size, memory, latency per part/engine (gap to the
    front in parentheses, '*' on the front)."""
    groups = panels(records)
    gaps = {k: front_gaps(v) for k, v in groups.items()}
    s = settings[0]
    lines = [f"{s['device']}; torch {s['torch']}; amp={s['amp']}; batch 1; median of "
             f"{s['rounds']} round-robin rounds, each run after {s['settle']} untimed run(s); "
             f"{s['date']}. `*` on the speed-accuracy front of its column, else (×g) = "
             'latency / that of the fastest model at least as accurate.', '']
    for task in ('seg', 'det'):
        keys = [k for k in groups if k[0] == task]
        if not keys:
            continue
        rows = [r for r in records if r['task'] == task]
        metrics = list(dict.fromkeys(m for r in rows for m in r['published']
                                     if m in ('mIoU', 'box AP', 'mask AP')))
        lines += [f'**{TITLES[task]}**', '',
                  '| model | ' + ' | '.join(f'{m} (published)' for m in metrics)
                  + ' | params M | GMACs | peak MB | '
                  + ' | '.join(f'ms {p}, {e}' for _, p, e in keys) + ' |',
                  '|---' * (len(metrics) + 4 + len(keys)) + '|']
        for r in rows:
            cells = []
            for k in keys:
                ms = r['ms'].get(k[1], {}).get(k[2])
                g = gaps[k].get(r['model'])
                cells.append('–' if ms is None else
                             f"{ms:.0f} {'*' if g == 1.0 else f'(×{g:.2f})'}")
            num = (lambda v, d=1: '–' if v is None else f'{v:.{d}f}')  # noqa: E731
            lines.append(f"| {r['model']} | "
                         + ' | '.join(format(r['published'][m], 'g') if m in r['published']
                                      else '–' for m in metrics)
                         + f" | {num(r['params_m'])} | {num(r['gmacs'])} "
                         f"| {num(r['mem_mb'], 0)} | " + ' | '.join(cells) + ' |')
        for r in rows:
            for part, engines in r.get('profile', {}).items():
                for e, prof in engines.items():
                    lines.append(f"- {r['model']}, {part}, {e}, top op types by time: "
                                 + ', '.join(f'{op} {ms:.0f} ms ({100 * share:.0f}%)'
                                             for op, ms, share in prof['ops']))
        errors = [f"{r['model']} {k}: {v}" for r in rows for k, v in r['errors'].items()]
        lines += [''] + [f'- not measured: {e}' for e in errors] + ([''] if errors else [])
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('json', nargs='+', help='dev/zoo_benchmark.py output(s)')
    p.add_argument('--png', help='chart to write')
    p.add_argument('--markdown', help='table to write (default: print)')
    args = p.parse_args(argv)
    records, settings = load(args.json)
    if args.png:
        plot(records, args.png)
    md = markdown(records, settings)
    if args.markdown:
        from paca_mm.fileio import atomic_write
        atomic_write(md, args.markdown)
    else:
        print(md)
    return md


if __name__ == '__main__':
    main()
