#!/usr/bin/env python3
"""dl-sgd's training in PyTorch DDP on GPUs: what dl-sgd --device cuda is
compared to (bench/sgd_gpu_compare.py, scripts/gpu-check).

The same model, data and batch as workloads/sgd.cc and bench/sgd_torch.py:
Fashion-MNIST (IDX .gz read with gzip and numpy, no torchvision), normalised
as dl-sgd, a seeded shuffle cut into equal parts per rank, batch
128 / world_size, a 784-128-10 MLP (Linear, ReLU, Linear) with cross-entropy,
SGD lr 0.01 momentum 0.5, gradients averaged by DistributedDataParallel over
NCCL. Both splits live on the GPU and batches are indexed there (no
DataLoader), and the loss is summed on the device, so a step waits for
nothing on the host: the strongest fair form of the loop. Rank 0 prints the
same per-epoch line as dl-sgd.

Run under torchrun (or dlaunch), one process per GPU:
  python3 -m torch.distributed.run --standalone --nproc_per_node 1 \\
      bench/sgd_ddp.py [--epochs N] [--data DIR]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from sgd_torch import DataPartitioner, Net, load_split


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch-size", type=int, default=128,
                    help="global batch, split across ranks (default 128)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu (gloo): a smoke check of this script on a "
                    "machine without a GPU")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=dev)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        sync = lambda: None  # noqa: E731
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    x, y = load_split(args.data, "train", 0)
    tx, ty = load_split(args.data, "t10k", 0)
    part = DataPartitioner(list(range(len(x))), [1.0 / size] * size).use(rank)
    mine = torch.tensor([part[i] for i in range(len(part))], device=dev)
    x, y = x.to(dev), y.to(dev)
    tx, ty = tx.to(dev), ty.to(dev)
    bsz = args.batch_size // size
    model = DDP(Net().to(dev),
                device_ids=[local_rank] if args.device == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234 + rank)
    for epoch in range(args.epochs):
        sync()
        t0 = time.perf_counter()
        order = mine[torch.randperm(len(mine), device=dev, generator=gen)]
        loss_sum = torch.zeros((), device=dev)
        steps = 0
        for s in range(0, len(order), bsz):
            idx = order[s:s + bsz]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
            steps += 1
        sync()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        stats = torch.stack([loss_sum.double(),
                             torch.tensor(float(steps), device=dev,
                                          dtype=torch.float64)])
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} "
                  f"loss {stats[0].item() / stats[1].item():.4f} "
                  f"test_acc {acc:.4f} "
                  f"samples/s {len(mine) * size / seconds:.0f} "
                  f"time {seconds:.2f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
