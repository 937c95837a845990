# The Mask R-CNN demo config + a hook that pauses after the checkpoint of iteration 2, so
# that tests/test_resume.py can kill the run there (tests/data is on PYTHONPATH in the test).
_base_ = ['../../demo/configs/mask_rcnn_tiny_synthetic_coco.py']
custom_imports = dict(imports=['paca_mm', 'demo.datasets', 'tools_pause_hook'],
                      allow_failed_imports=False)
custom_hooks = [dict(type='PauseAtIterHook', at_iter=2, seconds=300)]
