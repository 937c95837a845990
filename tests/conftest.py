import os

import torch

# Keep CPU tests predictable on the 2-core CI machine.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
