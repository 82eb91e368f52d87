"""NCCL allreduce (average, in place, on device memory) with 1 rank
through torch.distributed (under torchrun), the peer of nimbus's NCCL
collective. Each call is waited for (`torch.cuda.synchronize`), as nimbus
waits for each. Prints `<bytes> <seconds per allreduce>` per size given on
the command line."""

import sys
import time

import torch
import torch.distributed as dist

torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
for size in (int(s) for s in sys.argv[1:]):
    values = torch.ones(size // 4, dtype=torch.float32, device="cuda")
    iterations = max(5, min(2000, (256 << 20) // size))
    for _ in range(max(iterations // 10, 2)):
        dist.all_reduce(values, op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        dist.all_reduce(values, op=dist.ReduceOp.AVG)
        torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / iterations
    if dist.get_rank() == 0:
        print(f"{size} {elapsed:.9f}", flush=True)
dist.destroy_process_group()
