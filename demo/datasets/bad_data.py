"""Clear errors for missing or unreadable files in the demo datasets.

mmcv's loading transforms name the file only in some cases (``failed to load image: PATH``
for an undecodable image, ``[Errno 2] No such file or directory: 'PATH'``) and never the
dataset; a corrupt segmentation map gives PIL's ``cannot identify image file <_io.BytesIO
...>`` without any path. mmengine's ``BaseDataset`` does not catch exceptions of the pipeline
(it only re-draws another index when the pipeline returns ``None``). :class:`BadDataErrorsMixin`
adds what is missing, once for all demo datasets:

* building the dataset checks that every file its samples point at exists (one ``stat``
  per file) and raises :class:`MissingDataFileError` listing the missing ones;
* when loading a sample fails, the sample's files are checked; if one is missing or does
  not decode as an image, :class:`MissingDataFileError` / :class:`CorruptDataFileError` is
  raised from the original exception, naming the file, the dataset class, its
  ``data_root`` / ``ann_file``, the sample index and the fix. Any other failure (a
  transform bug, a bad config) propagates unchanged.

Both errors are ``OSError`` subclasses (:class:`MissingDataFileError` is also a
``FileNotFoundError``) whose message is one string, so they survive the re-raise in the main
process of a multi-worker ``DataLoader``.
"""
from typing import List, Optional, Tuple

# data_info keys -> what the file is, in messages
_ROLES = {'img_path': 'image', 'seg_map_path': 'segmentation map'}


class BadDataError(OSError):
    """A dataset sample cannot be loaded because one of its files is missing or unreadable.

    ``str(err)`` says which file, which dataset (class, ``data_root``, ``ann_file``), which
    sample and what to do; ``path``, ``dataset`` and ``index`` hold the first three.
    """
    path: Optional[str] = None
    dataset: Optional[str] = None
    index: Optional[int] = None


class MissingDataFileError(BadDataError, FileNotFoundError):
    """A file that a sample (or the annotation file) points at does not exist."""


class CorruptDataFileError(BadDataError):
    """A sample's file exists but cannot be read or decoded as an image."""


def _unreadable(path: str, backend_args: Optional[dict]) -> Optional[str]:
    """Why ``path`` cannot be loaded as an image (cv2 and PIL, as mmcv/mmseg do), or None."""
    import mmcv
    from mmengine import fileio
    try:
        data = fileio.get(path, backend_args=backend_args)
    except Exception as e:  # noqa: BLE001  (permissions, I/O error)
        return f'cannot be read ({type(e).__name__}: {e})'
    if not data:
        return 'is empty (0 bytes)'
    for backend in ('cv2', 'pillow'):
        try:
            img = mmcv.imfrombytes(data, flag='unchanged', backend=backend)
        except Exception as e:  # noqa: BLE001
            return f'is not a readable image ({backend}: {type(e).__name__}: {e})'
        if img is None:
            return f'is not a readable image ({backend} cannot decode its {len(data)} bytes)'
    return None


class BadDataErrorsMixin:
    """Put first in the bases of an mmengine ``BaseDataset`` subclass (see module docstring).

    ``bad_data_hint`` (formatted with ``data_root`` and ``ann_file``) says how to get good
    files back; the demo datasets set it to how their data is regenerated.
    """
    bad_data_hint = 'Replace or remove the file, or fix the annotation that points at it.'

    def _describe(self) -> str:
        parts = [f'data_root={self.data_root!r}']
        if getattr(self, 'ann_file', None):
            parts.append(f'ann_file={self.ann_file!r}')
        return f'{type(self).__name__}({", ".join(parts)})'

    def _hint(self) -> str:
        return self.bad_data_hint.format(data_root=self.data_root,
                                         ann_file=getattr(self, 'ann_file', '') or '')

    def _sample_files(self, info: dict) -> List[Tuple[str, str]]:
        """(role, path) of every file of one sample (``*_path`` keys with a string)."""
        return [(_ROLES.get(k, k), v) for k, v in sorted(info.items())
                if k.endswith('_path') and isinstance(v, str) and v]

    def _error(self, cls, message: str, path: str, index: Optional[int]) -> BadDataError:
        err = cls(f'{self._describe()}: {message}\n{self._hint()}')
        err.path, err.dataset, err.index = path, type(self).__name__, index
        return err

    def full_init(self):
        if self._fully_initialized:
            return
        super().full_init()
        from mmengine import fileio
        backend_args = getattr(self, 'backend_args', None)
        missing = [(role, path) for i in range(len(self))
                   for role, path in self._sample_files(self.get_data_info(i))
                   if not fileio.exists(path, backend_args=backend_args)]
        if missing:
            shown = '\n'.join(f'  {role}: {path}' for role, path in missing[:5])
            more = f'\n  ... and {len(missing) - 5} more' if len(missing) > 5 else ''
            raise self._error(
                MissingDataFileError,
                f'{len(missing)} file(s) that its samples point at do not exist:\n'
                f'{shown}{more}', missing[0][1], None)

    def prepare_data(self, idx):
        try:
            return super().prepare_data(idx)
        except Exception as err:
            try:
                bad = self._diagnose(idx)
            except Exception:  # noqa: BLE001  (the original error is the one to see)
                bad = None
            if bad is None:  # the files are fine: not a data problem
                raise
            raise bad from err

    def _diagnose(self, idx: int) -> Optional[BadDataError]:
        """The error for the first missing or unreadable file of sample ``idx``, or None."""
        from mmengine import fileio
        backend_args = getattr(self, 'backend_args', None)
        for role, path in self._sample_files(self.get_data_info(idx)):
            if not fileio.exists(path, backend_args=backend_args):
                return self._error(MissingDataFileError,
                                   f'sample {idx}: {role} file not found: {path}', path, idx)
            reason = _unreadable(path, backend_args)
            if reason is not None:
                return self._error(CorruptDataFileError,
                                   f'sample {idx}: {role} file {path} {reason}', path, idx)
        return None
