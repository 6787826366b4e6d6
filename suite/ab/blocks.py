"""The one ABBA block loop: trials of two or more sides in mirrored blocks, until the caller says stop.

Every timing of one revision against another runs through :func:`run_blocks`: `fleetbench ab`
(:func:`suite.ab.trials.compare_case`), `fleetbench bisect` (:func:`suite.ab.bisect.classify`, GOOD, BAD and
the commit tested).  A block
runs every side twice, in an order and its mirror image, so that a linear drift within the block costs every
side alike: with two sides ``ABBA`` or ``BAAB`` (each with probability 1/2), with more the sides shuffled and
mirrored (``ABCCBA``).  What a trial is (a request to a trial server), what a block's numbers mean, when to stop
and what to do between blocks (fresh preparations, fresh servers) is the caller's: ``after(block)`` sees each
block's results and returns True to stop.  Nothing here decides that two revisions are the same: `ab` answers
"identical" itself, before any server starts (``suite.cli.ab.identical``), so whatever reaches this loop is
timed.  ``tests/test_blocks.py`` fails on a second copy of the loop.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["block_order", "run_blocks"]

S = TypeVar("S")
R = TypeVar("R")


def block_order(sides: int, rng: random.Random) -> list[int]:
    """One block's order of side indices: ``[0, 1, 1, 0]`` or ``[1, 0, 0, 1]`` for two sides (one draw of
    ``rng.random()``), a shuffled order then its mirror image for more."""
    if sides == 2:
        return [0, 1, 1, 0] if rng.random() < 0.5 else [1, 0, 0, 1]
    order = list(range(sides))
    rng.shuffle(order)
    return order + order[::-1]


def run_blocks(sides: Sequence[S], trial: Callable[[S], R], rng: random.Random,
               after: Callable[[list[list[R]]], bool]) -> int:
    """Blocks of ``trial(side)`` in :func:`block_order` until ``after`` returns True; returns the blocks run.

    ``after`` gets the block's results per side, in the order of ``sides`` (each side's two trials in the order
    they ran); an exception of ``trial`` or ``after`` ends the blocks and is the caller's."""
    blocks = 0
    while True:
        got: list[list[R]] = [[] for _ in sides]
        for i in block_order(len(sides), rng):
            got[i].append(trial(sides[i]))
        blocks += 1
        if after(got):
            return blocks
