"""All-reduce over gloo with env:// init, exactly as under torchrun.

Every rank contributes rank+1; each checks the sum and prints one line.
"""
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")  # env:// : MASTER_ADDR/PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    assert t.item() == expected, (t.item(), expected)
    print(f"rank {rank}/{world} allreduce={t.item():g} ok")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
