"""Per-rank randomness from (seed, rank, step): what dropout, stochastic depth and random augmentation draw.

A data-parallel rank's random draws differ from its peers' (each rank masks its own shard) and from
step to step, but must be replayable: the correctness check's reference runs every rank's shard in
one process and has to draw the same masks.  So before each forward the engine sets this rank's
generators from :func:`step_seed` (``seed_step``), and the reference sets the same state before it
runs rank r's shard of that step; the readers' augmentation draws from a private generator seeded
the same way (``suite.data.reader``), whatever thread or worker runs it.

Cheap by construction: ``manual_seed`` of the CPU generator, and on CUDA of the rank's device
generator (its seed and offset live on the host): no synchronize, no kernel.
"""
from __future__ import annotations

import torch

__all__ = ["step_seed", "seed_step"]

_MASK = (1 << 64) - 1


def step_seed(seed: int, rank: int, step: int) -> int:
    """A 63-bit seed for (seed, rank, step): distinct for distinct triples, unrelated between neighbours
    (SplitMix64's finaliser over a linear mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + (rank + 1) * 0xBF58476D1CE4E5B9 + (step + 1) * 0x94D049BB133111EB) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) >> 1


def seed_step(seed: int, rank: int, step: int, device: torch.device | None = None) -> None:
    """Set the default generators (the CPU's, and ``device``'s on CUDA) from :func:`step_seed`."""
    s = step_seed(seed, rank, step)
    torch.random.default_generator.manual_seed(s)
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        generators = torch.cuda.default_generators
        if index < len(generators):
            generators[index].manual_seed(s)
        else:  # CUDA not initialised yet in this process: seeded when it is
            with torch.cuda.device(index):
                torch.cuda.manual_seed(s)
