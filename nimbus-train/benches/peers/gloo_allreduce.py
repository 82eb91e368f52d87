"""gloo allreduce bus bandwidth between 2 processes (under torchrun), the
peer of nimbus's shared-memory collective. Rank 0 prints
`<bytes> <seconds per allreduce>` per size given on the command line."""

import sys
import time

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
for size in (int(s) for s in sys.argv[1:]):
    values = torch.ones(size // 4, dtype=torch.float32)
    iterations = max(5, min(2000, (256 << 20) // size))
    for _ in range(max(iterations // 10, 2)):
        dist.all_reduce(values)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(values)
    elapsed = (time.perf_counter() - start) / iterations
    if dist.get_rank() == 0:
        print(f"{size} {elapsed:.9f}", flush=True)
dist.destroy_process_group()
