"""PyTorch DDP (gloo) on the train_mnist CNN: the peer of nimbus's training
benchmark. Run under torchrun as `ddp_mnist.py STEPS WARMUP`; rank 0 prints
`samples_per_s <value>` over the STEPS steps after WARMUP.

Same model (conv 1->32 3x3, pool, conv 32->64 3x3, pool, fc 3136->128,
fc 128->10), SGD momentum 0.9, batch 64 per worker, 1 thread per worker, and
the same data path as nimbus's loop: a dataset of MNIST's shape, a shuffling
DistributedSampler, each step's batch gathered by its indices, the loss read
back every step. The values are random: compute per step does not depend
on them.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
warmup = int(sys.argv[2]) if len(sys.argv) > 2 else 20


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


distributed = "WORLD_SIZE" in os.environ
if distributed:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = Net()
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
world = dist.get_world_size() if distributed else 1
samples = 64 * world * (steps + warmup + 1)
images = torch.randn(samples, 1, 28, 28)
labels = torch.randint(0, 10, (samples,))
if distributed:
    sampler = torch.utils.data.distributed.DistributedSampler(
        range(samples), shuffle=True, seed=0)
    order = list(sampler)
else:
    order = torch.randperm(samples).tolist()
for step in range(steps + warmup):
    if step == warmup:
        start = time.perf_counter()
    batch = torch.tensor(order[step * 64:(step + 1) * 64])
    opt.zero_grad()
    loss = F.cross_entropy(model(images[batch]), labels[batch])
    loss.backward()
    opt.step()
    loss.item()
elapsed = time.perf_counter() - start
if not distributed or dist.get_rank() == 0:
    print(f"samples_per_s {steps * 64 * world / elapsed:.1f}", flush=True)
if distributed:
    dist.destroy_process_group()
