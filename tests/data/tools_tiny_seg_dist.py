# tools_tiny_seg.py + a hook that saves each rank's final weights (tests/test_tools.py's
# 2-process DDP test compares them; tests/data is on PYTHONPATH there).
_base_ = ['tools_tiny_seg.py']
custom_imports = dict(imports=['paca_mm', 'tools_rank_weights_hook'], allow_failed_imports=False)
custom_hooks = [dict(type='SaveRankWeightsHook')]
