"""One collective table (issue 24, item 2): ``suite.comm.table.COLLECTIVES`` is exact at world 2 on every row, a
broken path is counted, nccl-tests' busbw factors, and ``fleetbench comm`` and the doctor take their collectives,
exact inputs and expected results from it."""
from __future__ import annotations

import ast
import os
import re

import pytest

from suite.comm.table import COLLECTIVES, Layout, busbw_factor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join("suite", "comm", "table.py")
# The sites of the table: the functions that run or check collectives through it.
SITES = {"suite/measure/collectives.py": ["allreduce_sweep_on_rank"],
         "suite/doctor.py": ["allreduce_exact_on_rank"]}
LAYOUTS = {"allreduce": [Layout()], "allreduce_comms": [Layout(comms=2), Layout(comms=2, pieces=3)],
           "hier": [Layout(ranks_per_node=1), Layout(ranks_per_node=2)],
           "hier_reduce": [Layout(ranks_per_node=1), Layout(ranks_per_node=2)],
           "intra": [Layout(ranks_per_node=1), Layout(ranks_per_node=2)], "broadcast": [Layout()]}


def table_on_rank(broken: bool = False) -> dict:
    """Every row on each of its layouts and dtypes: wrong elements on the exact inputs (``broken``: a run that
    does nothing)."""
    import torch

    from suite.comm.table import exact_inputs
    from suite.runtime.context import current

    ctx = current()
    out = {}
    for name, layouts in LAYOUTS.items():
        row = COLLECTIVES[name]
        for i, layout in enumerate(layouts):
            run = (lambda t: None) if broken else row.build(layout)
            for dtype in (torch.float32, torch.float64, torch.float16):
                for count in (6, 1030):  # divisible by the node's ranks; 3 pieces of 1030 are unequal
                    out[f"{name}/{i}/{dtype}/{count}"] = row.wrong(run, count, dtype, ctx.platform.device, layout)
            x = exact_inputs(4, ctx.rank, torch.float32)
            out[f"{name}/{i}/moves"] = row.nbytes(x)
    return out


def test_every_collective_gives_its_expected_result_at_world_2(pool2):
    answers = pool2.run(table_on_rank)
    assert set(answers[0]) == set(answers[1]) and len(answers[0]) == 10 * 7
    assert all(v == 0 for a in answers for k, v in a.items() if not k.endswith("moves")), answers
    assert all(v == 16 for a in answers for k, v in a.items() if k.endswith("moves"))


def test_a_broken_collective_is_counted(pool2):
    """A run that does nothing: every row's result is wrong on some rank, except the node phases on nodes of one
    rank, which have nothing to do (their expected result is the rank's own inputs)."""
    answers = pool2.run(table_on_rank, {"broken": True})
    for key in (k for k in answers[0] if not k.endswith("moves")):
        wrong = sum(a[key] for a in answers)
        if key.startswith("intra/0/"):
            assert wrong == 0, key
        else:
            assert wrong > 0, key


def test_busbw_factors_are_nccl_tests():
    for n in (2, 4, 8):
        assert COLLECTIVES["allreduce"].busbw_factor(n) == busbw_factor("all_reduce", n) == 2 * (n - 1) / n
        assert busbw_factor("all_gather", n) == busbw_factor("reduce_scatter", n) == (n - 1) / n
        assert COLLECTIVES["broadcast"].busbw_factor(n) == busbw_factor("reduce", n) == 1.0
    assert COLLECTIVES["intra"].busbw_factor(8, Layout(ranks_per_node=4)) == 1.5  # over the node's ranks
    assert busbw_factor("all_reduce", 1) == 0.0
    assert COLLECTIVES["intra"].contributors(5, 8, Layout(ranks_per_node=4)) == range(4, 8)
    assert COLLECTIVES["broadcast"].contributors(5, 8) == range(1)


def _tree(rel: str) -> ast.Module:
    return ast.parse(open(os.path.join(ROOT, rel), encoding="utf-8").read())


@pytest.mark.parametrize("rel", sorted(SITES))
def test_the_sites_take_their_collectives_from_the_table(rel):
    """Each site's functions name the table, and the site calls no collective, nor the two-level allreduce, itself
    (every one it runs or checks is a row of the table)."""
    tree = _tree(rel)
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    for fn in SITES[rel]:
        names = {n.id for n in ast.walk(funcs[fn]) if isinstance(n, ast.Name)}
        helpers = {n.func.id for n in ast.walk(funcs[fn]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        reach = names | {m.id for h in helpers & set(funcs) for m in ast.walk(funcs[h]) if isinstance(m, ast.Name)}
        assert "COLLECTIVES" in reach, f"{rel}:{fn} does not run its collectives from suite.comm.table"
    called = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "C"}
    called |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "hierarchical_all_reduce"}
    assert not called, f"{rel} runs {sorted(called)} itself instead of a row of suite.comm.table"


def test_exact_inputs_and_busbw_factors_are_written_once():
    """nccl-tests' inputs ((i mod 7)+1, the half-precision (i mod 3)+1) appear in the table only, the allreduce
    factor 2(n-1)/n in the one torch-free table of factors (suite/comm/busbw.py) only."""
    patterns = {"exact inputs": re.compile(r"%\s*[73]\s*\+\s*1"),
                "busbw factor": re.compile(r"2(\.0)?\s*\*\s*\(\s*\w+\s*-\s*1\s*\)\s*/\s*\w+")}
    bad = []
    for root, _, files in os.walk(os.path.join(ROOT, "suite")):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), ROOT)
            if not f.endswith(".py") or rel == TABLE:
                continue
            src = open(os.path.join(ROOT, rel), encoding="utf-8").read()
            for what, pat in patterns.items():
                if rel == os.path.join("suite", "comm", "busbw.py") and what == "busbw factor":
                    continue
                bad += [f"{rel}:{src.count(chr(10), 0, m.start()) + 1}: {what}" for m in pat.finditer(src)]
    assert bad == []
