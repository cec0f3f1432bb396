"""Fails on the first attempt, succeeds after a restart.

Rank 1 raises on TORCHELASTIC_RESTART_COUNT == 0 (through torch's @record,
which writes TORCHELASTIC_ERROR_FILE); on the restart every rank
all-reduces over gloo and succeeds.
"""
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and rank == 1:
        raise RuntimeError("injected failure on attempt 0")
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank {rank} attempt {attempt} sum={t.item():g}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
