# Each process sees exactly one device (its MIG instance) as cuda:0.
import os

print(f"rank {os.environ.get('RANK', '?')} process {os.environ.get('SKYFORGE_LOCAL_PROC', '0')} "
      f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
try:
    import torch

    if torch.cuda.is_available():
        print(f"  sees {torch.cuda.device_count()} device(s): {torch.cuda.get_device_name(0)}", flush=True)
except ImportError:
    pass
