"""torch.distributed gloo's side of the one-host comparison
(bench/onehost_compare.py): the operations and sizes bench/mpi_bench.c
measures, with the same conventions (nccl-tests' sizes: the whole buffer,
the splitting ops move size / ranks per rank; the ping-pong is OSU's
one-way time, half a round trip between ranks 0 and 1).

    /usr/bin/python3 bench/onehost_torch.py [--ranks 2] [-n ITERS] [-w WARMUP] SIZE...

Starts its own ranks (torch.multiprocessing, tcp:// init on loopback) and
prints one line per op and size, "op bytes time_us": each rank's mean time
per call, averaged over the ranks (OSU's statistic, as dl-bench and
bench/mpi_bench.c; the ping-pong's is rank 0's half round trip).
reduce_scatter is missing: torch 1.13's gloo backend has none.
"""
import argparse
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ["pingpong", "all_reduce", "broadcast", "reduce", "all_gather",
       "gather", "scatter", "all_to_all"]


def step(op, t, parts, rank, n):
    if op == "pingpong":
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        elif rank == 1:
            dist.recv(t, 0)
            dist.send(t, 0)
    elif op == "all_reduce":
        dist.all_reduce(t)
    elif op == "broadcast":
        dist.broadcast(t, 0)
    elif op == "reduce":
        dist.reduce(t, 0)
    elif op == "all_gather":
        dist.all_gather(parts, parts[rank].clone())
    elif op == "gather":
        dist.gather(parts[rank].clone(), parts if rank == 0 else None, 0)
    elif op == "scatter":
        dist.scatter(parts[rank], parts if rank == 0 else None, 0)
    elif op == "all_to_all":
        dist.all_to_all_single(t.clone(), t)


def worker(rank, n, port, sizes, iters, warmup):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    for op in OPS:
        for nbytes in sizes:
            count = max(nbytes // 4, n)
            t = torch.ones(count, dtype=torch.float32)
            parts = [torch.ones(count // n, dtype=torch.float32)
                     for _ in range(n)]
            for _ in range(warmup):
                step(op, t, parts, rank, n)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                step(op, t, parts, rank, n)
            us = (time.perf_counter() - start) * 1e6 / iters
            if op == "pingpong":
                us = us / 2 if rank == 0 else 0
            total = torch.tensor([us], dtype=torch.float64)
            dist.reduce(total, 0)
            if rank == 0:
                us = total.item() if op == "pingpong" else total.item() / n
                print(f"{op} {nbytes} {us:.2f}", flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("-n", type=int, default=20, dest="iters")
    p.add_argument("-w", type=int, default=5, dest="warmup")
    p.add_argument("sizes", type=int, nargs="+")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a.ranks, port, a.sizes, a.iters, a.warmup),
             nprocs=a.ranks)


if __name__ == "__main__":
    main()
