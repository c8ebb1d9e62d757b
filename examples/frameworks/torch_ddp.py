# A minimal DDP script: nothing skyforge-specific. The `torch` plugin exports MASTER_ADDR,
# MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK (and SKYFORGE_TORCH_BACKEND); env:// reads them.
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

backend = os.environ.get("SKYFORGE_TORCH_BACKEND", "gloo")
dist.init_process_group(backend)  # init_method="env://" is the default
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cpu")
if backend == "nccl":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)

torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1).to(device), device_ids=[device.index] if device.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)
for step in range(20):
    x = torch.randn(32, 8, generator=g).to(device)
    loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
t = torch.tensor([float(rank)], device=device)
dist.all_reduce(t)
# One write per line: the 2 processes of a node share its stdout, and print() under
# PYTHONUNBUFFERED (set for live output) writes the text and the newline separately, so two
# processes' lines could run together.
sys.stdout.write(f"rank {rank}/{world} loss {loss.item():.4f} sum_of_ranks {t.item():.0f}\n")
dist.destroy_process_group()
