"""A user's model whose next forward raises on every rank once armed (tests/test_recover.py): a rank error injected
into a prepared case's window, rank 0 leaving a collective queued that rank 1 never joins (as an overlapped
bucket's allreduce, or an NCCL kernel, is left when its peer fails)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from suite.models import ModelSpec
from tests.scripts.my_models import Blobs, TwoLayer

ARMED = [False]
ORPHANS: list = []  # the queued collectives, kept alive as an engine's pending work would be


def arm_on_rank() -> bool:
    """A rank function: the next forward of this rank's faulty model raises."""
    ARMED[0] = True
    return True


class Faulty(TwoLayer):
    def forward(self, x):
        if ARMED[0]:
            ARMED[0] = False
            if dist.get_rank() == 0:
                ORPHANS.append(dist.all_reduce(torch.ones(3), async_op=True))
            raise RuntimeError(f"injected rank error on rank {dist.get_rank()}")
        return super().forward(x)


def make_spec(size: str = "cpu") -> ModelSpec:
    return ModelSpec("faulty", lambda: Faulty(32, 16, 4), torch.nn.functional.cross_entropy,
                     lambda n, seed: Blobs(n, seed), data="other", size=size, per_rank_batch=8, dataset_size=256)
