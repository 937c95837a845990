import os

import torch

# Keep CPU tests predictable on the 2-core CI machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _isolate_global_state():
    """Tests must not leak process-wide state into each other: grad mode and mmengine's
    default scope (``init_default_scope`` in one test would redirect every later
    ``Registry.build`` to that toolbox)."""
    from mmengine.registry import DefaultScope
    grad = torch.is_grad_enabled()
    scopes = dict(DefaultScope._instance_dict)
    yield
    torch.set_grad_enabled(grad)
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(scopes)
