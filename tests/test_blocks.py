"""One ABBA block loop (issue 34): ``suite.ab.blocks.run_blocks`` is the only loop that runs trials of two or more
sides in mirrored blocks, and `ab` and `bisect` both call it."""
from __future__ import annotations

import ast
import json
import os
import random
import types

import pytest

from suite.ab import blocks
from suite.ab.blocks import block_order, run_blocks
from suite.results.records import CaseRecord
from tests.clitools import scan_suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "suite")
THE_LOOP = os.path.join("suite", "ab", "blocks.py")


def test_two_sides_run_abba_or_baab_and_more_sides_a_shuffled_order_and_its_mirror():
    rng = random.Random(5)
    seen = {tuple(block_order(2, rng)) for _ in range(50)}
    assert seen == {(0, 1, 1, 0), (1, 0, 0, 1)}
    # the draw is one rng.random() a block, as `ab` drew it before the loop was shared (its seeds keep their orders)
    a, b = random.Random("0:mlp/plain:2"), random.Random("0:mlp/plain:2")
    assert [block_order(2, a) for _ in range(20)] == [[0, 1, 1, 0] if b.random() < 0.5 else [1, 0, 0, 1]
                                                      for _ in range(20)]
    three = [block_order(3, rng) for _ in range(60)]
    assert all(o[:3] == o[3:][::-1] and sorted(o[:3]) == [0, 1, 2] for o in three)
    assert len({tuple(o) for o in three}) == 6  # every order of the three roles drawn


def test_blocks_run_until_the_caller_stops_them_and_give_each_sides_trials():
    calls: list = []
    seen: list = []

    def trial(side):
        calls.append(side)
        return f"{side}{len(calls)}"

    n = run_blocks(("A", "B"), trial, random.Random(1), lambda got: seen.append(got) or len(seen) == 3)
    assert n == 3 and len(calls) == 12
    for k, got in enumerate(seen):
        order = calls[4 * k:4 * k + 4]
        assert order in (list("ABBA"), list("BAAB"))
        assert got == [[f"A{4 * k + i + 1}" for i, s in enumerate(order) if s == "A"],
                       [f"B{4 * k + i + 1}" for i, s in enumerate(order) if s == "B"]]
    with pytest.raises(ZeroDivisionError):  # a failing trial ends the blocks; the caller handles it
        run_blocks((1, 0), lambda s: 1 / s, random.Random(0), lambda got: False)


# ---- every A/B timing calls the one loop ------------------------------------------------------------------------
class _Called(Exception):
    """Raised by the patched driver: the caller reached it."""


class _Server:
    """A trial server that answers every request at once (prepare, trial, structure, close)."""

    def __init__(self, *args, **kwargs):
        self.proc = types.SimpleNamespace(poll=lambda: None)
        self.n = 0

    def ready(self):
        return {}

    def send(self, op, **fields):
        return 1

    def receive(self, rid, what, timeout=None):
        return {}

    def request(self, op, timeout=None, **fields):
        if op == "prepare":
            self.n += 1
            return {"key": f"k{self.n}"}
        if op == "trial":
            return {"step_s": 0.1, "losses": [1.0]}
        if op == "structure":
            return {"record": json.loads(CaseRecord("mlp/plain", "mlp", 2, {}, "r", verdict="pass").to_json())}
        return {}

    def close(self):
        pass


@pytest.fixture
def driver(monkeypatch):
    """suite.ab.blocks.run_blocks replaced by a recorder that stops the caller."""
    called: list = []

    def fake(sides, trial, rng, after):
        called.append(len(sides))
        raise _Called

    monkeypatch.setattr(blocks, "run_blocks", fake)
    return called


def test_ab_and_bisect_both_time_through_the_one_driver(driver):
    from suite.ab.bisect import classify
    from suite.ab.trials import Side, _prepare, compare_case
    from suite.run_spec import AbOptions, RunSpec, Selection

    def side(label):
        return Side(label, label, label, "", "/nowhere", _Server())

    opts = RunSpec(Selection(worlds=(2,)), ab=AbOptions())
    with pytest.raises(_Called):
        compare_case(side("BASE"), side("HEAD"), "mlp/plain", 2, opts)
    good, bad = side("GOOD"), side("BAD")
    for s in (good, bad):
        _prepare(s, "mlp/plain", opts)
    with pytest.raises(_Called):
        classify(good, bad, side("c1"), "mlp/plain", opts, opts.ab.seq)
    assert driver == [2, 3]


# ---- no second copy of the loop -----------------------------------------------------------------------------------
def _mirrors(tree: ast.AST) -> list[int]:
    """Lines of a block's mirrored order written out: a palindromic literal of four or more items that are not all
    alike (``(base, head, head, base)``, ``(0, 1, 1, 0)``), or an order followed by its mirror image
    (``roles + roles[::-1]``, ``xs + list(reversed(xs))``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 4:
            items = [ast.dump(e) for e in node.elts]
            if items == items[::-1] and len(set(items)) > 1:
                found.append(node.lineno)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            right = node.right
            if isinstance(right, ast.Call) and getattr(right.func, "id", "") == "list" and right.args:
                right = right.args[0]
            mirrored = None
            if isinstance(right, ast.Subscript) and isinstance(right.slice, ast.Slice):
                step = right.slice.step
                if isinstance(step, ast.UnaryOp) and isinstance(step.op, ast.USub) or (
                        isinstance(step, ast.Constant) and step.value == -1):
                    mirrored = right.value
            elif isinstance(right, ast.Call) and getattr(right.func, "id", "") == "reversed" and right.args:
                mirrored = right.args[0]
            if mirrored is not None and ast.dump(mirrored) == ast.dump(node.left):
                found.append(node.lineno)
    return found


def test_no_second_abba_loop_in_suite():
    bad = scan_suite(_mirrors, THE_LOOP)
    assert bad == [], f"run trials in blocks through suite.ab.blocks.run_blocks, not a loop of its own: {bad}"


def test_the_scan_finds_the_old_loops():
    """The shapes the four copies had: ab's and the gate figure's ABBA/BAAB, bisect's mirrored shuffle, the gate
    sources' calibration (an injection switched on and off)."""
    ab = ("while True:\n    order = (base, head, head, base) if rng.random() < 0.5 else (head, base, base, head)\n"
          "    for side in order:\n        got[side.label].append(trial(side))\n")
    gate = "for b in range(blocks):\n    order = (0, 1, 1, 0) if rng.random() < 0.5 else (1, 0, 0, 1)\n"
    bisect = "while True:\n    rng.shuffle(roles)\n    for side in roles + roles[::-1]:\n        go(side)\n"
    calibration = "for on in ((False, True, True, False) if rng.random() < 0.5 else (True, False, False, True)):\n" \
                  "    go(on)\n"
    reversed_copy = "for side in order + list(reversed(order)):\n    go(side)\n"
    assert _mirrors(ast.parse(ab)) == [2, 2]
    assert _mirrors(ast.parse(gate)) == [2, 2]
    assert _mirrors(ast.parse(bisect)) == [3]
    assert _mirrors(ast.parse(calibration)) == [1, 1]
    assert _mirrors(ast.parse(reversed_copy)) == [1]
    assert _mirrors(ast.parse("xs = (1, 1, 1, 1)\nys = [a, b, c, d]\nz = a + b[::-1]\n")) == []  # not mirrors
