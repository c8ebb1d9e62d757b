# A real PyTorch DDP run, nothing skyforge-specific: init_process_group("gloo", "env://") reads
# MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE as the `torch` plugin exports them. Prints what
# test_real_frameworks.cpp (RealTorch) compares across the nodes:
#   world=<rank>/<size> env_rank=<RANK> env_world=<WORLD_SIZE>
#   allreduce=<sum over ranks of rank+1>       (3 on 2 ranks)
#   init=<sha256 of the parameters before training>
#   loss0=<this rank's loss on its first batch> (differs per rank: the data is rank-dependent)
#   weights=<sha256 of the parameters after training>  (identical on every rank under DDP)
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def checksum(module):
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


dist.init_process_group(backend="gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"world={rank}/{world} env_rank={os.environ['RANK']} env_world={os.environ['WORLD_SIZE']}", flush=True)

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t, op=dist.ReduceOp.SUM)
print(f"allreduce={t.item():g}", flush=True)

torch.manual_seed(1234)  # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
print(f"init={checksum(model)}", flush=True)
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + rank)  # each rank trains on its own data
for step in range(5):
    x = torch.randn(16, 4, generator=g)
    y = x.sum(dim=1, keepdim=True) * (rank + 1)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    if step == 0:
        print(f"loss0={loss.item():.6f}", flush=True)
    opt.zero_grad()
    loss.backward()  # DDP averages the gradients across ranks here
    opt.step()
print(f"weights={checksum(model)}", flush=True)
dist.barrier()
dist.destroy_process_group()
