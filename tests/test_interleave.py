"""One interleaving loop (issue 24, item 2): ``suite.measure.interleave.interleaved_rounds`` is the only loop
that rotates variants through rounds, and every timing site calls it."""
from __future__ import annotations

import ast
import os

import pytest

from suite.measure.interleave import interleaved_rounds, rotated, timed_block
from tests.clitools import scan_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "suite")
THE_LOOP = os.path.join("suite", "measure", "interleave.py")

# Every timing that compares variants: (file, function) -> it calls interleaved_rounds.
SITES = [("suite/measure/timing.py", "time_on_rank"), ("suite/measure/reader_timing.py", "measure_reader_on_rank"),
         ("suite/figures/comm.py", "comm_alone_on_rank"), ("suite/figures/compute.py", "optimizer_bench_on_rank"),
         ("suite/doctor.py", "fusion_timing_on_rank"), ("suite/measure/collectives.py", "allreduce_sweep_on_rank")]


def test_rounds_rotate_warm_up_and_collect_per_variant():
    calls = []
    got = interleaved_rounds("ABC", 4, lambda v: calls.append(v) or f"{v}{len(calls)}",
                             warmup=lambda v: calls.append(v.lower()))
    assert "".join(calls) == "abc" + "ABC" + "BCA" + "CAB" + "ABC"
    assert got == [["A4", "A9", "A11", "A13"], ["B5", "B7", "B12", "B14"], ["C6", "C8", "C10", "C15"]]


def test_warm_up_rounds_count_in_the_rotation_and_groups_rotate_on_their_own():
    calls: list = []
    got = interleaved_rounds([(s, v) for s in (1, 2) for v in "xy"], 2, lambda p: calls.append(p) or len(calls),
                             warmup_rounds=1, within=2)
    # round 0 (dropped): 1x 1y 2x 2y; round 1: 1y 1x 2y 2x; round 2: as round 0
    assert calls == [(1, "x"), (1, "y"), (2, "x"), (2, "y"), (1, "y"), (1, "x"), (2, "y"), (2, "x"),
                     (1, "x"), (1, "y"), (2, "x"), (2, "y")]
    assert got == [[6, 9], [5, 10], [8, 11], [7, 12]]
    assert rotated([1, 1, 2], 1) == [1, 2, 1]  # equal variants are still distinct turns
    assert interleaved_rounds([], 3, lambda v: v) == []


def test_timed_block_refuses_an_unknown_barrier_mode():
    with pytest.raises(ValueError, match="barriers='end': allowed both, start, none"):
        timed_block(lambda: None, 1, platform=None, barriers="end")


def _rotations(tree: ast.AST) -> list[int]:
    """Lines of ``xs[k:] + xs[:k]`` (the rotation idiom) and of a loop over rounds (``for r in range(...rounds
    ...)``) that runs a loop over variants (anything but a ``range``) inside it."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and all(
                isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Slice) for s in (node.left, node.right)):
            a, b = node.left.slice, node.right.slice  # type: ignore[attr-defined]
            if (a.lower is not None and a.upper is None and b.lower is None and b.upper is not None
                    and ast.dump(node.left.value) == ast.dump(node.right.value)):  # type: ignore[attr-defined]
                found.append(node.lineno)
        if (isinstance(node, ast.For) and isinstance(node.iter, ast.Call) and isinstance(node.iter.func, ast.Name)
                and node.iter.func.id == "range"
                and any("round" in n.id for a in node.iter.args for n in ast.walk(a) if isinstance(n, ast.Name))):
            inner = [f for stmt in node.body for f in ast.walk(stmt) if isinstance(f, ast.For)]
            if any(not (isinstance(f.iter, ast.Call) and isinstance(f.iter.func, ast.Name)
                        and f.iter.func.id == "range") for f in inner):
                found.append(node.lineno)
    return found


def test_no_second_interleaving_loop_in_suite():
    bad = scan_suite(_rotations, THE_LOOP)
    assert bad == [], f"interleave through suite.measure.interleave.interleaved_rounds, not a loop of its own: {bad}"


def test_the_scan_finds_the_old_loops():
    """The shapes the six copies had (time_on_rank's slices, the probes' rolling order, compute's loop)."""
    timing = ("for r in range(rounds):\n    for tc in runs[r % len(runs):] + runs[:r % len(runs)]:\n"
              "        tc.window(5)\n")
    probes = ("for r in range(warmup + rounds):\n    for size in sizes:\n        for v in order:\n            go(v)\n"
              "    order = order[1:] + order[:1]\n")
    compute = "for r in range(rounds):\n    for impl in order_of(r):\n        time_it(impl)\n"
    blocks = "for _ in range(rounds):\n    for _ in range(n):\n        run()\n"  # one variant's blocks: not a loop
    assert _rotations(ast.parse(timing)) == [1, 2]
    assert sorted(_rotations(ast.parse(probes))) == [1, 5]
    assert _rotations(ast.parse(compute)) == [1]
    assert _rotations(ast.parse(blocks)) == []


@pytest.mark.parametrize("rel,fn", SITES)
def test_every_timing_site_calls_the_one_loop(rel, fn):
    tree = ast.parse(open(os.path.join(ROOT, rel), encoding="utf-8").read())
    (func,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn]
    called = {n.func.id for n in ast.walk(func) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "interleaved_rounds" in called, f"{rel}:{fn} times variants without interleaved_rounds"


# ---- one timed block ------------------------------------------------------------------------------------------------
# The functions that read a clock around a barrier: the timed block, the step loop's window, the traced steps.
CLOCKED = {("suite/runtime/device.py", "timed_block"), ("suite/measure/timing.py", "timed_window"),
           ("suite/measure/trace.py", "trace_on_rank")}


def _clocked_barriers(tree: ast.AST) -> list[str]:
    """Functions that call a barrier and read a clock (perf_counter, process_time, a platform's now): a block of
    calls timed between barriers."""
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            called = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                      for n in ast.walk(fn) if isinstance(n, ast.Call)}
            if "barrier" in called and called & {"perf_counter", "process_time", "now", "monotonic"}:
                found.append(fn.name)
    return found


def test_no_second_timed_block_in_suite():
    """`fleetbench comm`'s sweep (measure/collectives.py) times through timed_block, as the interleaved timings do."""
    got = set()
    for root, _, files in os.walk(SUITE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, ROOT)
                got |= {(rel, fn) for fn in _clocked_barriers(ast.parse(open(path, encoding="utf-8").read()))}
    assert got == CLOCKED, f"time a block of calls through suite.runtime.device.timed_block: {got - CLOCKED}"


def test_the_timed_block_scan_finds_the_old_copies():
    microbench = ("def sweep():\n    platform.synchronize()\n    dist.barrier()\n    t0 = time.perf_counter()\n"
                  "    for _ in range(iters):\n        run(buf)\n    platform.synchronize()\n    dist.barrier()\n")
    calibrate = ("def calibration_on_rank():\n    for _ in range(rounds):\n        dist.barrier()\n"
                 "        c0, t0 = time.process_time(), time.perf_counter()\n        run()\n")
    assert _clocked_barriers(ast.parse(microbench)) == ["sweep"]
    assert _clocked_barriers(ast.parse(calibrate)) == ["calibration_on_rank"]
    assert _clocked_barriers(ast.parse("def f():\n    dist.barrier()\n")) == []
