"""Make ``--resume`` continue the training random stream exactly where it stopped.

mmengine checkpoints hold no RNG state, so a resumed run re-seeds and draws other dropout /
drop-path masks. :class:`RNGStateHook` (added by ``tools/train.py``) saves the torch (and
CUDA) RNG states in ``checkpoint['meta']['rng_state']`` and restores them in
``before_train`` of a resumed run (not for ``load_from``). Validation runs between RNG
snapshots, so it leaves the training stream unchanged (a validation DataLoader draws its
base seed from the torch RNG).

numpy / python ``random`` are deliberately not restored: iteration-based loops replay the
data pipeline of the skipped iterations on resume, which reproduces the augmentation from
the seed; restoring them would break that replay. Not reproduced exactly: torch-RNG
augmentation in the main process (``num_workers=0``), and main-process numpy augmentation
after an epoch-based resume (no replay there).
"""
from typing import Optional

import torch
from mmengine.hooks import Hook


class RNGStateHook(Hook):
    """Checkpoint and restore the torch RNG state for exact resume (see module doc)."""

    priority = 'VERY_LOW'

    def __init__(self):
        self._pending: Optional[dict] = None
        self._val_state: Optional[dict] = None

    @staticmethod
    def _get_state() -> dict:
        state = dict(torch=torch.get_rng_state())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state['cuda'] = torch.cuda.get_rng_state_all()
        return state

    @staticmethod
    def _set_state(state: dict) -> None:
        torch.set_rng_state(state['torch'])
        cuda = state.get('cuda')
        if cuda is not None and torch.cuda.is_available() \
                and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint.setdefault('meta', {})['rng_state'] = self._get_state()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        meta = checkpoint.get('meta', {})
        state = meta.get('rng_state')
        self._pending = None if state is None else dict(state=state, iter=meta.get('iter'))

    def before_train(self, runner) -> None:
        pending, self._pending = self._pending, None
        # resume sets the loop's iteration from the checkpoint; load_from leaves it at 0
        if pending is not None and runner.iter > 0 and runner.iter == pending['iter']:
            self._set_state(pending['state'])
            runner.logger.info(f'RNGStateHook: restored the torch RNG state of iteration '
                               f'{runner.iter}')

    def before_val(self, runner) -> None:
        self._val_state = self._get_state()

    def after_val(self, runner) -> None:
        if self._val_state is not None:
            self._set_state(self._val_state)
            self._val_state = None
