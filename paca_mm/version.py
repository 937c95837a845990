__version__ = '0.1.0'


def torch_version():
    """(major, minor) of the running torch, e.g. ``(2, 1)``."""
    import torch  # here, not at module level: setup.py reads this file without torch
    major, minor = torch.__version__.split('.')[:2]
    return int(major), int(minor)
