# tests/data/tools_tiny_seg.py + a module that SIGKILLs the training process halfway
# through writing the checkpoint named by PACA_TEST_KILL_SAVING (tests/data is on
# PYTHONPATH in tests/test_atomic_checkpoints.py).
_base_ = ['./tools_tiny_seg.py']
custom_imports = dict(imports=['paca_mm', 'tools_kill_during_save'], allow_failed_imports=False)
