"""The command-line semantics of ``tools/train.py`` and ``tools/test.py``: one set of tools
serves the three toolboxes; the config's ``default_scope`` selects whose modules are
registered and whose semantics (``--out``, ``--show-dir``, ``--tta``) apply."""
import copy
import importlib
import os
from typing import Any, List, Optional

import torch.distributed as torch_dist
from mmengine.config import Config, ConfigDict

from ..checkpoint import TRUST_ENV
from ..registry import register_toolbox_modules
from .cpu import adapt_cfg_to_device, init_cpu_distributed


def build_runner(cfg: Config):
    """Register the scope's modules, adapt ``cfg`` to the device, initialise CPU
    distributed if needed and build the Runner (``cfg.runner_type`` is honoured)."""
    scope = register_toolbox_modules(cfg)  # imports paca_mm: safe checkpoint loading
    notes = adapt_cfg_to_device(cfg)
    launcher = cfg.get('launcher', 'none')
    if init_cpu_distributed(launcher, cfg.get('env_cfg', {}).get('dist_cfg')):
        notes.append(f'rank {torch_dist.get_rank()}/{torch_dist.get_world_size()}: '
                     f'gloo process group initialised (launcher={launcher})')
    if 'runner_type' not in cfg:
        from mmengine.runner import Runner
        runner = Runner.from_cfg(cfg)
    else:
        runner = importlib.import_module(f'{scope}.registry').RUNNERS.build(cfg)
    for note in notes:
        runner.logger.info(note)
    if torch_dist.is_initialized():
        # one line per rank on stdout (the logger prints rank 0 only)
        print(f'[paca_mm] rank {torch_dist.get_rank()}/{torch_dist.get_world_size()} '
              f'ready (backend {torch_dist.get_backend()})', flush=True)
    return runner


def run_with_checkpoint_hint(fn, *args, **kwargs):
    """Call ``fn``; re-raise a weights-only unpickling failure with a hint on the fix. In a
    distributed run, all ranks then meet at a barrier and the process group is destroyed: a
    rank leaving while another still talks to rank 0's store aborts the peer (gloo: -6)."""
    import pickle
    try:
        result = fn(*args, **kwargs)
    except pickle.UnpicklingError as e:
        raise pickle.UnpicklingError(
            f'{e}\n\n[paca_mm] The checkpoint holds Python objects outside the allow-list of '
            'what mmengine Runner checkpoints contain (paca_mm.checkpoint.'
            'mmengine_checkpoint_globals), and checkpoints are loaded weights-only. If you '
            f'trust the file, pass --trust-checkpoint or set {TRUST_ENV}=1.') from e
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()
        torch_dist.destroy_process_group()
    return result


def set_work_dir(cfg: Config, work_dir: Optional[str], config_path: str) -> None:
    """CLI ``--work-dir`` > ``work_dir`` in the file > ``./work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = os.path.join('./work_dirs',
                                    os.path.splitext(os.path.basename(config_path))[0])


def apply_train_args(cfg: Config, amp: bool = False, auto_scale_lr: bool = False,
                     resume: Optional[str] = None) -> List[str]:
    """``--amp``, ``--auto-scale-lr`` and ``--resume [CKPT]`` as in mmdet/mmpretrain (and
    mmseg, whose bare ``--resume`` equals ``--resume auto``); returns log notes."""
    notes = []
    if amp:
        optim = cfg.get('optim_wrapper')
        if optim is None:
            raise ValueError('--amp needs an optim_wrapper in the config')
        kind = optim.get('type', 'OptimWrapper')
        if kind in ('AmpOptimWrapper', 'CPUAmpOptimWrapper'):
            notes.append('AMP training is already enabled in the config.')
        elif kind != 'OptimWrapper':
            raise ValueError('--amp is only supported when the optimizer wrapper type is '
                             f'OptimWrapper, got {kind!r}')
        else:
            optim.type = 'AmpOptimWrapper'
            optim.setdefault('loss_scale', 'dynamic')
    if auto_scale_lr:
        asl = cfg.get('auto_scale_lr')
        if not asl or 'base_batch_size' not in asl:
            raise ValueError('--auto-scale-lr needs auto_scale_lr=dict(enable=False, '
                             'base_batch_size=...) in the config')
        asl.enable = True
    if resume is not None:
        cfg.resume = True
        cfg.load_from = None if resume == 'auto' else resume
    return notes


def add_custom_hook(cfg: Config, name: str, note: str) -> List[str]:
    """Append ``dict(type=name)`` to ``cfg.custom_hooks`` unless the config has that hook;
    returns ``[note]`` when it was added, else ``[]``."""
    hooks = list(cfg.get('custom_hooks') or [])
    if any(h.get('type') in (name, f'mmengine.{name}') for h in hooks):
        return []
    cfg.custom_hooks = hooks + [dict(type=name)]
    return [note]


def _as_list(evaluator: Any) -> list:
    if evaluator is None:
        return []
    if isinstance(evaluator, dict) and 'metrics' in evaluator:  # Evaluator config
        return list(evaluator['metrics'])
    return list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]


def trigger_visualization(cfg: Config, scope: str, show: bool = False,
                          show_dir: Optional[str] = None, wait_time: float = 2.,
                          interval: Optional[int] = None) -> None:
    """Turn on the config's visualization hook the way each toolbox's test.py does;
    ``interval`` (draw every N-th batch) defaults to 1 for mmpretrain, else to the hook's
    own setting (SegVisualizationHook: 50)."""
    hooks = cfg.get('default_hooks', {})
    if 'visualization' not in hooks:
        raise ValueError('--show/--show-dir need a `visualization` entry in default_hooks '
                         '(e.g. SegVisualizationHook, DetVisualizationHook, VisualizationHook)')
    hook = hooks['visualization']
    if scope == 'mmpretrain':
        hook['enable'] = True
        hook['interval'] = 1 if interval is None else interval
        if show_dir:
            hook['out_dir'] = show_dir
    else:
        hook['draw'] = True
        if interval is not None:
            hook['interval'] = interval
        if show_dir and scope == 'mmseg':
            cfg.visualizer['save_dir'] = show_dir
        elif show_dir:  # mmdet: relative to work_dir/timestamp
            hook['test_out_dir'] = show_dir
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time


def _default_flip_tta_pipeline(test_pipeline: list, scope: str) -> list:
    """test pipeline with its last (packing) step replaced by a flip/no-flip TestTimeAug
    (mmdet's packing also keeps the ``flip`` meta keys its TTA models read)."""
    tta, pack = copy.deepcopy(list(test_pipeline)), copy.deepcopy(test_pipeline[-1])
    if scope == 'mmdet' and 'meta_keys' in pack:
        pack['meta_keys'] = tuple(pack['meta_keys']) + ('flip', 'flip_direction')
    flips = [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)]
    tta[-1] = dict(type='TestTimeAug', transforms=[flips, [pack]])
    return tta


def apply_tta(cfg: Config, scope: str) -> None:
    """``--tta``: wrap ``cfg.model`` in ``cfg.tta_model`` and test with ``cfg.tta_pipeline``.

    mmseg requires both in the config; mmdet and mmpretrain default to a flip pipeline and
    their TTA model, as their test.py do, but a detector with a mask head gets
    :class:`~paca_mm.models.test_time_augs.MaskRCNNTTAModel` (``DetTTAModel`` refuses masks).
    Type names are unprefixed: mmdet registers ``DetTTAModel`` in mmengine's root registry.
    """
    test_dataset = cfg.test_dataloader.dataset
    if scope == 'mmseg':
        missing = [k for k in ('tta_model', 'tta_pipeline') if k not in cfg]
        if missing:
            raise ValueError(f'--tta needs {missing} in the config (mmseg has no default)')
    elif scope == 'mmdet':
        masks = cfg.model.get('roi_head', {}).get('mask_head') is not None
        cfg.setdefault('tta_model', dict(
            type='MaskRCNNTTAModel' if masks else 'DetTTAModel',
            tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100)))
        while 'dataset' in test_dataset:
            test_dataset = test_dataset['dataset']
        if 'batch_shapes_cfg' in test_dataset:
            test_dataset.batch_shapes_cfg = None
    else:  # mmpretrain
        cfg.setdefault('tta_model', dict(type='AverageClsScoreTTA'))
    if 'tta_pipeline' not in cfg:
        cfg.tta_pipeline = _default_flip_tta_pipeline(test_dataset.pipeline, scope)
    test_dataset.pipeline = cfg.tta_pipeline
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)


def apply_test_args(cfg: Config, scope: str, checkpoint: str, out: Optional[str] = None,
                    show: bool = False, show_dir: Optional[str] = None, wait_time: float = 2.,
                    tta: bool = False, interval: Optional[int] = None) -> None:
    """The ``tools/test.py`` options with each toolbox's semantics (``--show``/``--show-dir``:
    :func:`trigger_visualization`; ``--tta``: :func:`apply_tta`). ``--out``: mmseg -> folder
    of prediction maps (``test_evaluator.output_dir``, ``keep_results``); mmdet/mmpretrain ->
    ``.pkl`` of the predictions (DumpDetResults/DumpResults)."""
    cfg.load_from = checkpoint
    if show or show_dir:
        trigger_visualization(cfg, scope, show, show_dir, wait_time, interval)
    if tta:
        apply_tta(cfg, scope)
    if out is None:
        return
    if scope == 'mmseg':
        if cfg.get('test_evaluator') is None:
            raise ValueError('--out needs a test_evaluator (IoUMetric) in the config')
        for metric in _as_list(cfg.test_evaluator):
            metric['output_dir'] = out
            metric['keep_results'] = True
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise ValueError(f'--out must be a .pkl/.pickle file for {scope}, got {out!r}')
    dump = dict(type='mmdet.DumpDetResults' if scope == 'mmdet' else 'DumpResults',
                out_file_path=out)
    cfg.test_evaluator = _as_list(cfg.get('test_evaluator')) + [dump]
