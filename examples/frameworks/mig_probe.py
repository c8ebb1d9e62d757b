# Each process sees exactly one device (its MIG instance) as cuda:0.
import os
import sys

# One write per line (see torch_ddp.py): the processes of a node share its stdout.
sys.stdout.write(f"rank {os.environ.get('RANK', '?')} process {os.environ.get('SKYFORGE_LOCAL_PROC', '0')} "
                 f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
try:
    import torch

    if torch.cuda.is_available():
        sys.stdout.write(f"  sees {torch.cuda.device_count()} device(s): {torch.cuda.get_device_name(0)}\n")
except ImportError:
    pass
