# Accelerator() reads the torch variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT, LOCAL_RANK) and
# ACCELERATE_* from the environment the `huggingface` plugin set.
import sys

import torch
from accelerate import Accelerator

acc = Accelerator()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
model, opt, loader = acc.prepare(model, opt, loader)
for x, y in loader:
    with acc.accumulate(model):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
# One write per line (see torch_ddp.py): processes of a node share its stdout.
sys.stdout.write(f"process {acc.process_index}/{acc.num_processes} accumulation {acc.gradient_accumulation_steps} "
                 f"loss {loss.item():.4f}\n")
