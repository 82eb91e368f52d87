"""PyTorch DDP (gloo) on the train_mnist CNN: the peer of nimbus's training
benchmark. Run under torchrun; rank 0 prints `samples_per_s <value>`.

Same model (conv 1->32 3x3, pool, conv 32->64 3x3, pool, fc 3136->128,
fc 128->10), SGD momentum 0.9, batch 64 per worker, 1 thread per worker.
The data are random tensors of MNIST's shape: compute per step does not
depend on the values.
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
warmup = max(steps // 10, 2)


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
images = torch.randn(64, 1, 28, 28)
labels = torch.randint(0, 10, (64,))
for step in range(steps + warmup):
    if step == warmup:
        start = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    opt.step()
elapsed = time.perf_counter() - start
if not distributed or dist.get_rank() == 0:
    print(f"samples_per_s {steps * 64 * world / elapsed:.1f}", flush=True)
if distributed:
    dist.destroy_process_group()
