# tools_tiny_seg.py + a hook that pauses after the checkpoint of iteration 3, so that
# tests/test_resume.py can kill the run there (the hook module is on PYTHONPATH in the test).
_base_ = ['./tools_tiny_seg.py']
custom_imports = dict(imports=['paca_mm', 'tools_pause_hook'], allow_failed_imports=False)
custom_hooks = [dict(type='PauseAtIterHook', at_iter=3, seconds=300)]
