#!/usr/bin/python3
"""The seeds' distributed SGD in PyTorch: the reference dl-sgd is compared to.

Same method as workloads/sgd.cc: Fashion-MNIST (IDX .gz read with gzip and
numpy, no torchvision), a seeded shuffle cut into equal parts per rank
(DataPartitioner), a DataLoader with batch 128 / world_size, a 784-128-10 MLP
(Linear, ReLU, Linear) with cross-entropy, SGD lr 0.01 momentum 0.5 and the
seeds' average_gradients (one all_reduce per parameter tensor). Rank 0 prints
the same per-epoch line as dl-sgd.

Run under torchrun (Debian's torch 1.13 needs -r 1 -t 1 --log_dir on 3.11):
  /usr/bin/python3 -m torch.distributed.run -r 1 -t 1 --log_dir DIR \
      --nproc_per_node 2 bench/sgd_torch.py [--epochs N] [--data DIR]
"""

import argparse
import gzip
import os
import random
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndims = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndims).reshape(dims)


def load_split(data_dir, split, limit):
    def pick(base):
        for name in (base + ".gz", base):
            p = os.path.join(data_dir, name)
            if os.path.exists(p):
                return p
        raise SystemExit(f"missing {os.path.join(data_dir, base)}[.gz]")
    x = read_idx(pick(f"{split}-images-idx3-ubyte"))
    y = read_idx(pick(f"{split}-labels-idx1-ubyte"))
    if limit:
        x, y = x[:limit], y[:limit]
    x = (x.reshape(len(x), -1).astype(np.float32) / 255.0 - 0.1307) / 0.3081
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


class Partition:
    def __init__(self, data, index):
        self.data, self.index = data, index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        return self.data[self.index[i]]


class DataPartitioner:
    """The seeds' partitioner: one seeded shuffle, equal contiguous parts."""

    def __init__(self, data, sizes, seed=1234):
        self.data = data
        self.partitions = []
        rng = random.Random()
        rng.seed(seed)
        indexes = list(range(len(data)))
        rng.shuffle(indexes)
        for frac in sizes:
            part_len = int(frac * len(data))
            self.partitions.append(indexes[:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--limit-train", type=int, default=0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)
    x, y = load_split(args.data, "train", args.limit_train)
    tx, ty = load_split(args.data, "t10k", 0)
    dataset = list(zip(x, y))
    partition = DataPartitioner(dataset, [1.0 / size] * size).use(rank)
    bsz = int(128 / float(size))
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz,
                                            shuffle=True)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        epoch_loss, batches = 0.0, 0
        for data, target in train_set:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
            batches += 1
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        stats = torch.tensor([epoch_loss, batches], dtype=torch.float64)
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} "
                  f"loss {stats[0].item() / stats[1].item():.4f} "
                  f"test_acc {acc:.4f} "
                  f"samples/s {len(partition) * size / seconds:.0f} "
                  f"time {seconds:.2f}s", flush=True)


if __name__ == "__main__":
    main()
