"""`fleetbench comm`'s micro-benchmark: exact verification of every allreduce path, nccl-tests' formulas."""
from __future__ import annotations

import pytest

from suite.cli.comm import parse_size
from suite.comm.table import busbw_factor
from suite.measure.collectives import allreduce_sweep_on_rank, format_table, merge, parse_variant
from tests.clitools import cli as _cli
from tests.clitools import one_error as _one_error

VARIANTS = ["flat", "hier", "hier_reduce", "comm3"]


def test_nccl_tests_formulas_and_parsing():
    assert [busbw_factor("all_reduce", n) for n in (1, 2, 4, 8)] == [0.0, 1.0, 1.5, 1.75]
    answers = [{"world": 4, "dtype": "float32", "rows": [{"bytes": 4_000_000, "count": 1_000_000, "variant": "flat",
                                                          "seconds": s, "wrong": w}]}
               for s, w in [(0.002, 0), (0.004, 1)]]
    (row,) = merge(answers)
    assert row["seconds"] == 0.004 and row["algbw"] == pytest.approx(1.0) and row["busbw"] == pytest.approx(1.5)
    assert row["wrong"] == 1 and "| 4000000 | 1000000 | float32 | flat |" in format_table([row], 4)
    assert parse_size("1K") == 1024 and parse_size("16M") == 16 * 2**20 and parse_size("8") == 8
    with pytest.raises(ValueError, match="size 'abc'"):
        parse_size("abc")
    with pytest.raises(ValueError, match="variant 'hier' needs --inter-nranks"):
        parse_variant("hier", 4, 3)
    with pytest.raises(ValueError, match="allowed: flat, hier, hier_reduce"):
        parse_variant("ring", 4, 2)


def broken_sweep_on_rank(**kwargs):
    """The sweep with the hierarchical path's inter-node step pointed at the intra-node group (the collective
    table's rows call it through the module)."""
    import dataclasses

    from suite.comm import hierarchical
    from suite.measure import collectives as microbench

    saved = hierarchical.hierarchical_all_reduce
    hierarchical.hierarchical_all_reduce = lambda t, ng, mode: saved(t, dataclasses.replace(ng, inter=ng.intra), mode)
    try:
        return microbench.allreduce_sweep_on_rank(**kwargs)
    finally:
        hierarchical.hierarchical_all_reduce = saved


def test_every_path_is_exact_and_breakage_is_counted(pool4):
    kw = dict(sizes=[64, 4096], variants=VARIANTS, inter_nranks=2, iters=1, warmup=0, rounds=3)
    answers = pool4.run(allreduce_sweep_on_rank, kw)
    rows = merge(answers)
    assert [(r["bytes"], r["variant"]) for r in rows] == [(s, v) for s in (64, 4096) for v in VARIANTS]
    assert all(r["wrong"] == 0 for r in rows), rows
    for a in answers:  # the variants of a size took turns in 3 rounds (issue 44.7); a row is the median round
        for r in a["rows"]:
            assert len(r["rounds"]) == 3 and r["seconds"] == sorted(r["rounds"])[1] > 0, r
    # (only the scatter schedule: in the reduce schedule the wrong group would pair mismatched collectives)
    broken = merge(pool4.run(broken_sweep_on_rank, dict(kw, variants=["flat", "hier"], rounds=1)))
    assert all(r["wrong"] > 0 for r in broken if r["variant"] == "hier"), broken
    assert all(r["wrong"] == 0 for r in broken if r["variant"] == "flat")


def test_one_node_is_not_presented_as_hierarchical(no_ranks, capsys):
    """2 ranks in nodes of 2 are one node (a reduce-scatter and an all-gather, no inter-node step): the default
    sweep leaves the hierarchical variants out and says why; naming them is refused before any rank starts."""
    from suite.cli.main import main
    from suite.measure.collectives import default_variants

    assert default_variants(4, 2) == (["flat", "hier", "hier_reduce", "comm2", "comm3"], "")
    variants, note = default_variants(2, 2)
    assert variants == ["flat", "comm2", "comm3"]
    assert note.startswith("hier and hier_reduce left out (they need at least 2 nodes): 2 ranks in nodes of 2 make "
                           "one node")
    assert default_variants(3, 2) == (["flat", "comm2", "comm3"], "")  # nodes of 2 do not split 3: nothing to say
    assert parse_variant("hier", 4, 2) == ("hier", 2)
    with pytest.raises(ValueError, match="variant 'hier_reduce' needs at least 2 nodes: 4 ranks in nodes of 4"):
        parse_variant("hier_reduce", 4, 4)
    assert main(["comm", "--nproc", "2", "--variants", "flat,hier"]) == 2
    assert "variant 'hier' needs at least 2 nodes" in capsys.readouterr().err


@pytest.mark.parametrize("argv,words", [
    (["comm", "-n", "100000000000"], ["--iters 100000000000"]),
    (["comm", "--timeout", "1e-9"], ["--timeout 1e-09", ">= 1"]),
])
def test_comm_bounds_its_iterations_and_timeout(capsys, no_ranks, argv, words):
    code, _, err = _cli(argv, capsys)
    _one_error(code, err, *words)
