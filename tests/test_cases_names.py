"""Cases prove their names: what each variant's name requires is planned in the parent from the model's
parameter sizes (no rank), a case that cannot meet it is skipped with the reason, and what the engine built is
compared with the plan (a difference is a failure).  One test per requirement, the sizing rule at every model and
size, and the plan checked against the ranks' observation, broken on purpose once."""
from __future__ import annotations

import pytest

from suite.cases import REQUIRES, VARIANTS
from suite.comm.buckets import SIZED_BUCKETS, plan, sized_bucket_mb
from suite.config import ConfigError
from suite.measure import timing
from suite.measure.summary import Timed
from suite.model_registry import REGISTRY, SIZES
from suite.models import model_info
from suite.results.records import Describe, Metrics
from suite.run_spec import RunFacts, RunOptions, Selection
from suite.runner import CaseRunner
from suite.selection import base_cases, resolve, resolve_at

NAMED = {"fusion": ("fusion",), "overlap": ("overlap",), "multicomm": ("overlap", "communicators"),
         "hierarchical": ("nodes",), "compute_fusion": ("fused",)}


def _at(world: int, *cases: str, local_world: int | None = None, size: str = "cpu", sets: tuple = ()) -> dict:
    sel = Selection(cases=cases, size=size, sets=sets)
    return {rc.case.name: rc for rc in resolve_at(sel, base_cases(sel, size), world, local_world, size)}


def test_every_variant_named_for_a_communication_pattern_states_what_its_name_requires():
    declared = {v.name: v.requires for v in VARIANTS if v.requires}
    assert declared == NAMED
    assert {r for rs in declared.values() for r in rs} == set(REQUIRES)


@pytest.mark.parametrize("model", [m.name for m in REGISTRY])
def test_sized_buckets_give_2_to_16_buckets_at_every_size(model):
    """The rule (suite.comm.buckets.sized_bucket_mb): about a tenth of the gradient bytes, 2 to 16 buckets."""
    for size in SIZES:
        grads = model_info(model, size).gradients
        cap = sized_bucket_mb(grads)
        n = len(plan(grads, True, cap, 50))
        total_mb = sum(g[0] for g in grads) / 2**20
        assert SIZED_BUCKETS[0] <= n <= SIZED_BUCKETS[1], (model, size, cap, n)
        assert total_mb / 64 <= cap <= total_mb, (model, size, cap, total_mb)  # a share of the gradients


def test_default_run_overlaps_and_skips_one_node_hierarchical():
    """`fleetbench run`'s default selection at its default world (2) and size (cpu): every overlap and multicomm
    case plans 2 or more buckets on its communicators; */hierarchical is skipped, saying why."""
    resolved = resolve(Selection(), probe=False)
    assert resolved.worlds == (2,) and resolved.size == "cpu"
    seen = set()
    for rc, _ in resolved.matrix():
        if rc.case.variant in ("overlap", "multicomm"):
            seen.add(rc.case.variant)
            assert rc.skip is None and rc.plan.overlap and 2 <= rc.plan.buckets <= 16, (rc.case.name, rc.plan)
            assert rc.plan.communicators == (2 if rc.case.variant == "multicomm" else 1)
        if rc.case.variant == "hierarchical":
            seen.add("hierarchical")
            assert rc.skip and "at least 2 nodes of at least 2 ranks" in rc.skip and "1 node" in rc.skip, rc.skip
    assert seen == {"overlap", "multicomm", "hierarchical"}


# ---- one test per requirement --------------------------------------------------------------------------------------
def test_overlap_needs_two_buckets_and_a_set_bucket_size_still_wins():
    assert _at(2, "mlp/overlap")["mlp/overlap"].plan.buckets == 4  # 15.8 MB of gradients, cap 1.51 MiB
    rc = _at(2, "mlp/*", sets=("fuse_grad_size_in_MB=25",))["mlp/overlap"]
    assert rc.config.fuse_grad_size_in_MB == 25 and rc.plan.buckets == 1
    assert rc.skip.startswith("needs at least 2 buckets, the first launched before backward ends: "
                              "fuse_grad_size_in_MB=25 makes 1 bucket of the model's 15.8 MB"), rc.skip
    rc = _at(2, "mlp/*", sets=("sync_nccl_allreduce=true",))["mlp/overlap"]
    assert "sync_nccl_allreduce=True waits on each bucket" in rc.skip
    with pytest.raises(ConfigError, match="case mlp/overlap cannot run at world size 2: needs at least 2 buckets"):
        _at(2, "mlp/overlap", sets=("fuse_grad_size_in_MB=25",))  # named exactly: an error, before any rank


def test_multicomm_needs_buckets_on_two_communicators():
    assert _at(2, "mlp/multicomm")["mlp/multicomm"].skip is None
    rc = _at(2, "mlp/*", sets=("nccl_comm_num=1",))["mlp/multicomm"]
    assert rc.skip.startswith("needs buckets on at least 2 communicators: its 4 bucket(s) use 1"), rc.skip
    rc = _at(2, "mlp/*", sets=("fuse_grad_size_in_MB=100",))["mlp/multicomm"]  # one bucket: neither holds
    assert rc.skip.startswith("needs at least 2 buckets"), rc.skip


def test_hierarchical_needs_two_nodes_of_two_ranks_here_and_under_torchrun():
    assert "make 1 node," in _at(2, "mlp/*")["mlp/hierarchical"].skip
    four = _at(4, "mlp/hierarchical")["mlp/hierarchical"]
    assert four.skip is None and (four.plan.nodes, four.plan.ranks_per_node) == (2, 2)
    one_host = _at(4, "mlp/*", local_world=4)["mlp/hierarchical"]  # torchrun, one host of 4 ranks: one node
    assert "4 ranks in nodes of 4 make 1 node" in one_host.skip and "2 or more hosts" in one_host.skip
    two_hosts = _at(4, "mlp/hierarchical", local_world=2)["mlp/hierarchical"]
    assert two_hosts.skip is None and two_hosts.plan.nodes == 2


def test_fusion_needs_fewer_collectives_than_gradients():
    assert _at(2, "mlp/fusion")["mlp/fusion"].plan.buckets == 1
    unfused = ("fuse_all_reduce_ops=false", "sync_nccl_allreduce=false")  # buckets still, one tensor each
    rc = _at(2, "mlp/fus*", "mlp/overlap", sets=unfused)["mlp/fusion"]
    assert rc.skip == ("needs fewer collectives than gradients: 10 collective(s) for 10 gradient(s) "
                       "(fuse_all_reduce_ops=False)"), rc.skip
    rc = _at(2, "mlp/fus*", "mlp/plain", sets=("fuse_all_reduce_ops=false",))["mlp/fusion"]  # plain
    assert rc.skip == "needs fewer collectives than gradients, but its config does not bucket gradients"


def test_a_broken_precondition_is_caught_before_any_rank(monkeypatch, no_ranks):
    """Break the sizing on purpose (overlap back to a fixed 25 MB, as before this rule): the default mlp/overlap
    and mlp/multicomm are then skipped with the reason instead of being run under their names."""
    monkeypatch.setattr("suite.selection.sized_bucket_mb", lambda grads, layers=50: 25.0)
    rcs = _at(2, "mlp/*")
    for name in ("mlp/overlap", "mlp/multicomm"):
        assert rcs[name].skip and "makes 1 bucket" in rcs[name].skip, rcs[name].skip


# ---- the plan against what the engine built ------------------------------------------------------------------------
def _record(rc, describe: dict):
    runner = CaseRunner(None, 2, RunOptions(check=False, utilization=False), metadata={}, reporter=False)
    return runner.record(rc, None, Timed(Metrics(), Describe.from_dict(describe)))


def test_an_engine_that_differs_from_its_plan_fails_the_case():
    rc = _at(2, "mlp/overlap")["mlp/overlap"]
    built = [{"params": 2, "layers": 1, "bytes": 1, "comm": 0}] * 4
    ok = _record(rc, {"strategy": "bucketed", "allreduce_ops": 4, "buckets": built, "launched_in_backward": 3})
    assert ok.verdict != "fail" and ok.structure.launched_in_backward == 3
    late = _record(rc, {"strategy": "bucketed", "allreduce_ops": 4, "buckets": built, "launched_in_backward": 0})
    assert late.verdict == "fail" and "no bucket was launched before backward ended" in late.error, late.error
    fewer = _record(rc, {"strategy": "bucketed", "allreduce_ops": 2, "buckets": built[:2], "launched_in_backward": 1})
    assert fewer.verdict == "fail" and "the plan has 4 bucket(s), the engine built 2" in fewer.error, fewer.error


def late_time_on_rank(**kwargs):
    """time_on_rank with buckets launched only once backward has returned: the hooks count gradients and launch
    nothing; finish_step launches every bucket."""
    from suite.comm import bucketed

    cls = bucketed.BucketedGradSync
    saved_launch, saved_note = cls._launch_ready, cls._note_launched_in_backward

    def launch(self):
        if not self._armed:  # finish_step has disarmed: backward is over
            saved_launch(self)

    def note_then_launch(self):
        saved_note(self)
        saved_launch(self)

    cls._launch_ready, cls._note_launched_in_backward = launch, note_then_launch
    try:
        return timing.time_on_rank(**kwargs)
    finally:
        cls._launch_ready, cls._note_launched_in_backward = saved_launch, saved_note


class _Late:
    """The pool, with its timing calls made through late_time_on_rank."""

    def __init__(self, pool):
        self.pool = pool

    def run(self, fn, kwargs=None, timeout=None):
        return self.pool.run(late_time_on_rank if fn is timing.time_on_rank else fn, kwargs, timeout=timeout)


@pytest.mark.parametrize("launch", ["as planned", "after backward"])
def test_the_ranks_launch_buckets_before_backward_ends_as_planned(pool2, launch):
    """mlp/overlap and mlp/multicomm on two ranks: 4 buckets each, at least one launched before backward ended
    in every step, as the plan said; with launches held until backward ended, the same cases fail."""
    rcs = list(_at(2, "mlp/plain", "mlp/overlap", "mlp/multicomm", size="tiny").values())
    launcher = pool2 if launch == "as planned" else _Late(pool2)
    runner = CaseRunner(launcher, 2, RunOptions(check=False, utilization=False, rounds=1, steps=2, warmup=1),
                        metadata={}, reporter=False, facts=RunFacts(size="tiny"))
    (records,) = list(runner.run(rcs))
    got = {r.case: r for r in records}
    for name in ("mlp/overlap", "mlp/multicomm"):
        rec = got[name]
        assert rec.describe.engine["allreduce_ops"] == 4 and len(rec.describe.engine["buckets"]) == 4
        if launch == "as planned":
            assert rec.verdict != "fail" and rec.describe.engine["launched_in_backward"] >= 1, (rec.verdict, rec.error)
        else:
            assert rec.describe.engine["launched_in_backward"] == 0
            assert rec.verdict == "fail" and "no bucket was launched before backward ended" in rec.error


@pytest.mark.heavy  # `fleetbench run` with its defaults, as a subprocess (about a minute): make test-slow
def test_fleetbench_run_with_its_defaults_overlaps_and_skips_one_node_hierarchical(tmp_path):
    import json
    import os
    import re
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = tmp_path / "runs.jsonl"
    proc = subprocess.run([sys.executable, "-m", "suite.cli.main", "run", "--rounds", "2", "--steps", "2",
                           "--warmup", "1", "--no-utilization", "--results", str(results)], cwd=root,
                          env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    for name in ("resnet/overlap", "mlp/overlap", "mlp/multicomm"):
        rec = recs[name]
        assert rec["verdict"] == "pass" and len(rec["describe"]["buckets"]) >= 2, rec
        assert rec["describe"]["launched_in_backward"] >= 1 and rec["structure"]["launched_in_backward"] >= 1
        line = re.search(rf"{name} .*allreduce ops \d+ before fusion, (\d+) after, (\d+) launched before backward "
                         "ended", proc.stdout)
        assert line and int(line.group(1)) >= 2 and int(line.group(2)) >= 1, proc.stdout[-3000:]
    hier = recs["mlp/hierarchical"]
    assert hier["verdict"] == "skipped" and "at least 2 nodes of at least 2 ranks" in hier["error"], hier
