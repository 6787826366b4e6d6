"""A rank error with a collective left queued on its peer, then one more call (tests/test_torchrun.py)."""
import json
import sys

import torch
import torch.distributed as dist

from suite.runtime.launch import init_from_env, shutdown
from suite.runtime.pool import RankError
from suite.runtime.torchrun import TorchrunLauncher

PENDING = []

def leave_one_queued():
    t = torch.full((1,), 100.0)
    if dist.get_rank() == 0:
        PENDING.append(dist.all_reduce(t, async_op=True))  # queued; rank 1 never joins it
        return 0
    raise ValueError("boom on rank 1")

def reduce_rank():
    t = torch.full((1,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return t.item()

if __name__ == "__main__":
    ctx = init_from_env(device="cpu", pg_timeout=20)
    launcher = TorchrunLauncher(ctx, report_timeout=5)  # rebuilds by default, gloo too
    try:
        try:
            launcher.run(leave_one_queued)
        except RankError:
            pass
        out = launcher.run(reduce_rank, timeout=30)
        if ctx.rank == 0:
            json.dump({"sums": out, "rebuilds": launcher.rebuilds}, open(sys.argv[1], "w"))
    finally:
        shutdown()
