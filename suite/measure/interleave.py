"""The one interleaving loop: every variant once in every round, the order rotated round by round.

Every timing of the suite that compares variants (``time_on_rank``, the reader benchmark, the
collectives alone of the ``comm`` and ``workloads`` figures, the optimizer benchmark, the cluster
probes) runs through :func:`interleaved_rounds`: round ``r`` runs the variants starting at index
``r mod n`` (A B C, B C A, C A B, …), so slow drifts of a noisy machine hit every variant alike.
What a variant's turn does (a window of training steps between barriers, a block of collectives)
is the caller's ``run_one``; :func:`timed_block` is the block of back-to-back calls several sites time (defined
beside the platform's clock, ``suite.runtime.device``, so that the ranks of the lower layers time through it too).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..runtime.device import BARRIERS, timed_block

__all__ = ["interleaved_rounds", "rotated", "timed_block", "BARRIERS"]

T = TypeVar("T")
R = TypeVar("R")


def rotated(items: Sequence[T], r: int, within: int | None = None) -> list[T]:
    """Round ``r``'s order: ``items`` cut into consecutive groups of ``within`` (default: one group), each
    group rotated to start at its element ``r mod len(group)``."""
    within = within or len(items) or 1
    out: list[T] = []
    for g in range(0, len(items), within):
        group = list(items[g:g + within])
        k = r % len(group)
        out += group[k:] + group[:k]
    return out


def interleaved_rounds(variants: Sequence[T], rounds: int, run_one: Callable[[T], R], *,
                       warmup: Callable[[T], Any] | None = None, warmup_rounds: int = 0,
                       within: int | None = None) -> list[list[R]]:
    """``rounds`` rounds of ``run_one(variant)`` for every variant in the rotated order; returns, per variant
    (in the order given), what ``run_one`` returned in each timed round.

    ``warmup(variant)`` runs once per variant, in the order given, before the first round;
    ``warmup_rounds`` more rounds run first and are dropped (they count in the rotation);
    ``within``: the variants are consecutive groups of this many, each rotated on its own and the groups
    run one after the other in every round (the cluster probes: every size's variants in turn).
    """
    if warmup is not None:
        for v in variants:
            warmup(v)
    out: list[list[R]] = [[] for _ in variants]
    for r in range(warmup_rounds + rounds):
        for i in rotated(range(len(variants)), r, within):
            got = run_one(variants[i])
            if r >= warmup_rounds:
                out[i].append(got)
    return out
