"""torch.distributed gloo all_reduce, measured like allreduce_bench.cc.

Starts its own ranks (torch.multiprocessing) with tcp:// init on loopback:

    /usr/bin/python3 bench/allreduce_torch.py [--ranks 2] [--json]

Rank 0 prints one line per size: the median over repetitions of the mean
time of `iters` back-to-back all_reduces of float32 (SUM), with nccl-tests'
bus bandwidth (bytes / time * 2(n-1)/n).
"""
import argparse
import json
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES = [(4 << 10, 2000, 7), (1 << 20, 100, 7), (64 << 20, 6, 7)]


def worker(rank, n, port, as_json):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=n)
    for nbytes, iters, reps in SIZES:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        for _ in range(max(3, iters // 10)):
            dist.all_reduce(t)
        per_op = []
        for _ in range(reps):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            per_op.append((time.perf_counter() - start) / iters)
        per_op.sort()
        sec = per_op[len(per_op) // 2]
        best = per_op[0]
        algbw = nbytes / sec / 1e9
        busbw = algbw * 2 * (n - 1) / n
        if rank == 0:
            if as_json:
                print(json.dumps({"impl": "torch", "ranks": n, "bytes": nbytes,
                                  "time_us": round(sec * 1e6, 2),
                                  "best_us": round(best * 1e6, 2),
                                  "algbw_gbs": round(algbw, 4),
                                  "busbw_gbs": round(busbw, 4)}), flush=True)
            else:
                print(f"{nbytes:10d} bytes  {sec * 1e6:10.1f} us  "
                      f"algbw {algbw:7.3f} GB/s  busbw {busbw:7.3f} GB/s  "
                      f"(best {best * 1e6:.1f} us)",
                      flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(a.ranks, port, a.json), nprocs=a.ranks)


if __name__ == "__main__":
    main()
