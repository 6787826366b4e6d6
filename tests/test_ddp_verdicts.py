"""Verdicts that agree with torch DDP on the kinds of model torch's own DDP tests train (tests/scripts/ddp_models.py).

The truth is computed here, independently of fleetbench's check and its reference: torch DDP itself on the session's
gloo ranks, and one process, on the same shards, from the same initial weights and with the same optimizer
(:func:`truth_on_rank`); a case's verdict must be "pass" exactly when the case's engine trains as torch DDP does
(parameters within fp32's tolerance after the check's steps), and "fail" otherwise.  The engines' loop zeroes
gradients in place (``zero_grad(set_to_none=False)``), so the torch loop here does too.

`fleetbench run` is driven in-process on the session's pools, as tests/test_user_models.py does.
"""
from __future__ import annotations

import contextlib
import io
import json
import time

import pytest
import torch
import torch.nn.functional as F

import suite.runtime
from suite.check.harness import check_on_rank, run_check
from suite.cli.main import main
from suite.config import ConfigError, StrategyConfig
from suite.data.synthetic import shard, step_indices
from suite.engine import build_engine
from suite.models import get_model
from suite.run_spec import Selection
from suite.runtime import RankError
from suite.runtime.context import current
from suite.selection import resolve
from suite.workload import WorkloadSpec

MODELS = "tests.scripts.ddp_models"
STEPS = 3  # the check's steps
TOL = 1e-5  # fp32's, as in torch's DDP tests

# the cases' strategy settings (suite/cases.py), written out: overlap with small buckets (one tensor each)
PLAIN: dict = {}
DDP = {"data_parallel": "ddp"}
OVERLAP = {"fuse_all_reduce_ops": True, "sync_nccl_allreduce": False, "fuse_grad_size_in_MB": 1e-4}
FUSED_OPTIMIZER = {"fuse_all_optimizer_ops": True}
LOCAL_SGD = {"use_local_sgd": True, "local_sgd_steps": 4, "local_sgd_is_warm_steps": 1}


class Borrowed:
    def __init__(self, pool):
        self.pool = pool

    def run(self, *args, **kwargs):
        return self.pool.run(*args, **kwargs)

    def close(self):
        pass


def run_cli(pool, tmp_path, factory: str, *cases: str, sets: tuple = ()) -> tuple[int, str, dict, float]:
    """`fleetbench run` of ``factory``'s ``cases`` on the session's ``pool`` (its world): exit code, output, the
    records by case, seconds."""
    mp, buf = pytest.MonkeyPatch(), io.StringIO()
    results = tmp_path / f"{factory}-{pool.nproc}.jsonl"
    argv = ["run", "--model", f"{MODELS}:{factory}", "--size", "tiny", "--rounds", "2", "--steps", "2", "--warmup",
            "1", "--no-utilization", "--nproc", str(pool.nproc), "--results", str(results)]
    for c in cases:
        argv += ["--case", c]
    for s in sets:
        argv += ["--set", s]
    pool.start()  # before the command: ranks it started would carry its run token, and its end sweeps those
    t0 = time.monotonic()
    try:
        mp.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pool))
        with contextlib.redirect_stdout(buf):
            rc = main(argv)
    finally:
        mp.undo()
    recs = {r["case"]: r for r in map(json.loads, results.read_text().splitlines())}
    return rc, buf.getvalue(), recs, time.monotonic() - t0


# ---- the truth: torch DDP and one process ------------------------------------------------------------------------
def _call(model, inputs):
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def _sgd(params, config: dict) -> torch.optim.Optimizer:
    cfg = StrategyConfig.from_dict(config)
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def truth_on_rank(model: str, configs: dict, steps: int = STEPS, seed: int = 0) -> dict:
    """On every rank: torch DDP trained ``steps`` steps on this rank's shards of the check's global batches, and each
    of ``configs``' fleetbench engines on the same shards; rank 0 also trains one process over every shard (the
    per-shard losses averaged: the global batch of these per-sample models, and the same batches where the model's
    control flow looks at its batch).  Every model starts from rank 0's initial weights, as DDP and the engines
    broadcast them."""
    ctx = current()
    world, rank = ctx.world_size, ctx.rank
    spec = get_model(f"{MODELS}:{model}", "tiny")
    batch = spec.per_rank_batch * world
    n = max(spec.dataset_size, 2 * batch)  # the check's dataset (suite/workload.py)
    data = spec.dataset(n, seed)

    def shard_of(step: int, r: int):
        return data.get(shard(step_indices(n, step, batch, seed), r, world))

    find_unused = any(StrategyConfig.from_dict(c).find_unused_parameters for c in configs.values()) or \
        spec.find_unused_parameters
    first = next(iter(configs.values()))
    net = spec.make(seed, rank=rank)
    ddp = torch.nn.parallel.DistributedDataParallel(net, find_unused_parameters=find_unused)
    opt = _sgd(net.parameters(), first)
    for step in range(steps):
        x, y = shard_of(step, rank)
        opt.zero_grad(set_to_none=False)
        spec.loss_fn(_call(ddp, x), y).backward()
        opt.step()
    out: dict = {"ddp": {k: v.detach().clone() for k, v in net.named_parameters()},
                 "initial": {k: v.detach().clone() for k, v in spec.make(seed, rank=0).named_parameters()}}
    del ddp
    for name, config in configs.items():
        cfg = StrategyConfig.from_dict({"find_unused_parameters": spec.find_unused_parameters, **config})
        engine = build_engine(spec.make(seed + 7919 * rank, rank=rank), spec.loss_fn, cfg)  # ranks start different
        for step in range(steps):
            engine.train_step(*shard_of(step, rank))
        out[name] = {k: v.detach().clone() for k, v in engine.module.named_parameters()}
    if rank == 0:
        one = spec.make(seed, rank=0)
        opt = _sgd(one.parameters(), first)
        for step in range(steps):
            opt.zero_grad(set_to_none=False)
            for r in range(world):
                x, y = shard_of(step, r)
                (spec.loss_fn(_call(one, x), y) / world).backward()
            opt.step()
        out["one_process"] = {k: v.detach().clone() for k, v in one.named_parameters()}
    return out


def worst(a: dict, b: dict) -> tuple[float, str]:
    """The largest max|a - b| / max(max|b|, 1e-2) over the tensors, and where (nan: inf)."""
    errs = {}
    for k in b:
        d = (a[k] - b[k]).abs().max().item()
        errs[k] = d / max(b[k].abs().max().item(), 1e-2) if d == d else float("inf")
    k = max(errs, key=errs.get)
    return errs[k], k


def trains_as_ddp(truth: list[dict], name: str) -> bool:
    """Whether engine ``name`` holds torch DDP's parameters on every rank."""
    return all(worst(t[name], t["ddp"])[0] <= TOL for t in truth)


def verdict(pool, model: str, config: dict) -> str:
    summary = run_check(pool, WorkloadSpec(f"{MODELS}:{model}", "tiny"), StrategyConfig.from_dict(config),
                        steps=STEPS)
    return summary.verdict


def assert_verdicts_equal_truth(pool, model: str, configs: dict) -> list[dict]:
    truth = pool.run(truth_on_rank, dict(model=model, configs=configs))
    assert worst(truth[0]["one_process"], truth[0]["ddp"])[0] <= TOL, "torch DDP and one process disagree"
    declared = get_model(f"{MODELS}:{model}", "tiny").find_unused_parameters
    for name, config in configs.items():
        want = "pass" if trains_as_ddp(truth, name) else "fail"
        got = verdict(pool, model, {"find_unused_parameters": declared, **config})
        assert got == want, f"{model} {name}: fleetbench says {got}, torch DDP says {want} " \
                            f"(worst {worst(truth[0][name], truth[0]['ddp'])})"
    return truth


# ---- 1. sparse gradients -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sparse_run(pool2, tmp_path_factory):
    return run_cli(pool2, tmp_path_factory.mktemp("sparse"), "make_sparse", "*/plain", "*/ddp", "*/none",
                   "*/overlap", "*/fusion", "*/fused_optimizer")


def test_sparse_gradients_train_under_plain_and_ddp(sparse_run):
    rc, out, recs, _ = sparse_run
    assert rc == 0, out
    for case in ("ddp_models.make_sparse/plain", "ddp_models.make_sparse/ddp"):
        assert (recs[case]["status"], recs[case]["verdict"]) == ("ok", "pass"), recs[case]
    assert "cannot run this" not in out, out


def test_sparse_gradients_skip_flat_buckets_with_the_reason_and_none_is_timed(sparse_run):
    rc, out, recs, _ = sparse_run
    for case in (f"ddp_models.make_sparse/{v}" for v in ("overlap", "fusion", "fused_optimizer")):
        rec = recs[case]
        assert rec["status"] == "skipped" and rec["error"].startswith("sparse gradients: "), rec
        assert "'embedding.weight'" in rec["error"] and "dense gradients only" in rec["error"], rec["error"]
    none = recs["ddp_models.make_sparse/none"]
    assert none["status"] == "ok" and none["metrics"]["samples_per_s"] > 0, none


def test_sparse_gradients_verdicts_equal_torch_ddp_and_one_process(pool2):
    truth = assert_verdicts_equal_truth(pool2, "make_sparse", {"plain": PLAIN, "ddp": DDP})
    assert trains_as_ddp(truth, "plain") and trains_as_ddp(truth, "ddp")  # what torch does: both train it


# ---- 2. an unused parameter with weight decay ----------------------------------------------------------------------
WD = {"weight_decay": 0.1}


def test_an_unused_parameter_keeps_no_gradient_as_torch_does(pool2):
    configs = {"plain": WD, "ddp": {**DDP, **WD}, "overlap": {**OVERLAP, **WD},
               "fused_optimizer": {**FUSED_OPTIMIZER, **WD}}
    truth = assert_verdicts_equal_truth(pool2, "make_unused", configs)
    for t in truth:  # hand-written from torch's semantics: no gradient, so SGD skips it: weight decay never shrinks it
        assert torch.equal(t["ddp"]["c.weight"], t["initial"]["c.weight"])
        for name in configs:
            assert torch.equal(t[name]["c.weight"], t["initial"]["c.weight"]), name
    assert torch.equal(truth[0]["one_process"]["c.weight"], truth[0]["initial"]["c.weight"])


def test_local_sgd_leaves_an_unused_parameter_alone(pool2):
    # Local SGD is not DDP; torch's rule still holds: a parameter no rank ever gives a gradient is never stepped
    truth = pool2.run(truth_on_rank, dict(model="make_unused", configs={"local_sgd": {**LOCAL_SGD, **WD}}))
    assert all(torch.equal(t["local_sgd"]["c.weight"], t["initial"]["c.weight"]) for t in truth)
    assert verdict(pool2, "make_unused", {**LOCAL_SGD, **WD, "find_unused_parameters": True}) == "pass"


# ---- 3. find_unused_parameters with overlap ------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 4])
def test_find_unused_with_overlap_launches_buckets_in_backward_and_passes(pools, tmp_path, world):
    pool = pools(world)
    rc, out, recs, _ = run_cli(pool, tmp_path, "make_unused", "*/overlap", "*/multicomm", sets=("weight_decay=0.1",))
    assert rc == 0, out
    for case in ("ddp_models.make_unused/overlap", "ddp_models.make_unused/multicomm"):
        rec = recs[case]
        assert (rec["status"], rec["verdict"]) == ("ok", "pass"), rec
        assert rec["config"]["find_unused_parameters"] is True  # the factory declared it
        assert rec["describe"]["launched_in_backward"] >= 1, rec["describe"]
    assert "after its check passed" not in out and "interleaved timing" not in out, out  # the baseline ran too
    assert all(rec["metrics"]["speedup"] for rec in recs.values()), "timed with its baseline (plain, declared too)"
    truth = pool.run(truth_on_rank, dict(model="make_branchy_declared", configs={"overlap": OVERLAP}))
    assert trains_as_ddp(truth, "overlap")
    assert any(not torch.equal(t["ddp"]["lin2.weight"], t["initial"]["lin2.weight"]) for t in truth[:1]), \
        "the control flow used lin2 somewhere (else this shows nothing)"
    assert verdict(pool, "make_branchy_declared", {**OVERLAP, "find_unused_parameters": True}) == "pass"


def test_a_case_whose_check_steps_break_its_plan_is_never_said_to_pass(pool2, tmp_path, monkeypatch):
    # what the engine built and did is compared with the plan in the check's own steps: a broken promise is said as
    # the check's verdict ("check fail: ..."), never "check pass" followed by a failed record
    from suite.cases import Case

    def broken(self, plan, describe):
        return "plan and observation differ: sabotaged" if "buckets" in describe else None

    monkeypatch.setattr(Case, "observed_unmet", broken)
    rc, out, recs, _ = run_cli(pool2, tmp_path, "make_unused", "*/overlap", "*/plain")
    line = next(ln for ln in out.splitlines() if "ddp_models.make_unused/overlap" in ln and " check " in ln)
    assert " check fail" in line and "sabotaged" in line, line
    assert recs["ddp_models.make_unused/overlap"]["verdict"] == "fail" and rc == 1
    assert recs["ddp_models.make_unused/plain"]["verdict"] == "pass"


# ---- 5. reasons that name the cause --------------------------------------------------------------------------------
def _both_ranks_raised(pool, model: str, config: dict) -> tuple[RankError, float]:
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        pool.run(check_on_rank, dict(workload_spec=WorkloadSpec(f"{MODELS}:{model}", "tiny"), config=config, steps=3),
                 timeout=120)
    return info.value, time.monotonic() - t0


def test_a_model_that_differs_across_ranks_stops_every_rank_at_once_naming_it(pool2):
    err, seconds = _both_ranks_raised(pool2, "make_differs", StrategyConfig().to_dict())
    assert sorted(err.tracebacks) == [0, 1], "every rank stops, none left waiting in a collective"
    said = {tb.strip().splitlines()[-1] for tb in err.tracebacks.values()}
    assert len(said) == 1, said  # the same message on every rank
    msg = said.pop()
    assert "StructureMismatch: the ranks built different models" in msg
    assert "rank 1: parameter 'embedding.weight' shape (8, 10) vs rank 0's (16, 10)" in msg, msg
    assert seconds < 30, seconds


def test_a_mismatched_model_is_an_error_naming_the_mismatch_in_every_case(pool2, tmp_path):
    rc, out, recs, seconds = run_cli(pool2, tmp_path, "make_differs", "*/plain", "*/overlap", "*/ddp")
    assert rc == 1
    for case in ("ddp_models.make_differs/plain", "ddp_models.make_differs/overlap", "ddp_models.make_differs/ddp"):
        rec = recs[case]
        assert rec["status"] == "error" and rec["error"].startswith("the ranks built different models"), rec["error"]
        assert "'embedding.weight' shape (8, 10) vs rank 0's (16, 10)" in rec["error"]
    assert "Connection reset" not in out and out.count("shape (8, 10) vs rank 0's") == 1, out
    assert seconds < 30, seconds


def test_ranks_that_take_different_branches_all_stop_with_the_fix(pool2):
    # precondition (the data, not fleetbench): at the check's first step rank 0's and rank 1's shards branch apart
    spec = get_model(f"{MODELS}:make_branchy", "tiny")
    data = spec.dataset(64, 0)
    first = [data.get(shard(step_indices(64, 0, 8, 0), r, 2))[0] for r in range(2)]
    assert len({bool(x[:, 0].sum() > 0) for x in first}) == 2
    for config in (PLAIN, OVERLAP, DDP):
        err, seconds = _both_ranks_raised(pool2, "make_branchy", StrategyConfig.from_dict(config).to_dict())
        assert sorted(err.tracebacks) == [0, 1], (config, "a rank was left waiting in a collective")
        said = {tb.strip().splitlines()[-1] for tb in err.tracebacks.values()}
        assert len(said) == 1, said
        msg = said.pop()
        assert msg.startswith("RuntimeError: set find_unused_parameters=true"), msg
        assert "'lin2.weight'" in msg and "different branches" in msg, msg
        assert seconds < 30


# ---- 4. torch's test utilities freeze torch.backends' flags ---------------------------------------------------------
def thaw_on_rank() -> bool:
    """torch.backends' flags settable again on this rank, as before the model module froze them (the session's pool
    goes on as it was); True if they were frozen.  Here, not in tests/scripts/frozen_flags_models.py: importing that
    module freezes them."""
    try:
        torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark
        was = False
    except RuntimeError:
        was = True
    vars(torch.backends)["__allow_nonbracketed_mutation_flag"] = True
    return was


def test_frozen_backends_flags_do_not_stop_a_case(pool2):
    try:
        summary = run_check(pool2, WorkloadSpec("tests.scripts.frozen_flags_models:make_plain", "tiny"),
                            StrategyConfig(cudnn_benchmark=True), steps=2)
        assert summary.verdict == "pass", summary.message
    finally:
        thawed = pool2.run(thaw_on_rank)
    assert thawed == [True, True], "the model module froze the flags on the ranks (else this shows nothing)"


# ---- 6. cases that prove their names -------------------------------------------------------------------------------
def test_compute_fusion_with_nothing_to_fuse_is_skipped(no_ranks):
    r = resolve(Selection(models=(f"{MODELS}:make_bn_nothing_to_fuse",), size="tiny", device="cpu"))
    rc = r.find("ddp_models.make_bn_nothing_to_fuse/compute_fusion", 2)
    assert rc is not None and rc.skip and rc.skip.startswith("nothing to fuse"), rc and rc.skip
    assert r.find("ddp_models.make_bn_nothing_to_fuse/plain", 2).skip is None


def test_a_compute_fusion_case_whose_engine_fused_nothing_fails():
    from suite.cases import get_case

    case = get_case("resnet/compute_fusion")
    report = {"bn_act": {"enabled": True, "found": 3, "fused": 0}, "elewise_add_act": {"enabled": True, "found": 0,
              "fused": 0}, "relu_depthwise_conv": {"enabled": False, "found": 2, "fused": 0}}
    why = case.observed_unmet(None, {"compute_fusion": report})
    assert why and "nothing to fuse" in why and "found but not fusable: bn_act 3" in why, why
    report["bn_act"]["fused"] = 1
    assert case.observed_unmet(None, {"compute_fusion": report}) is None


def test_a_knob_that_contradicts_a_case_name_is_refused(no_ranks):
    with pytest.raises(ConfigError, match=r"--set amp=fp16 contradicts the case's name: mlp/amp_bf16 runs amp='bf16'"):
        resolve(Selection(cases=("mlp/amp_bf16",), sets=("amp=fp16",), device="cpu"))
    r = resolve(Selection(cases=("mlp/*",), sets=("amp=fp16",), device="cpu"))
    assert "contradicts the case's name" in r.find("mlp/amp_bf16", 2).skip
    assert r.find("mlp/plain", 2).skip is None  # plain's name says nothing of amp
    assert resolve(Selection(cases=("mlp/amp_bf16",), sets=("amp=bf16",), device="cpu")).find("mlp/amp_bf16", 2).skip \
        is None


# ---- 7. wrapping a model -------------------------------------------------------------------------------------------
def test_tuple_inputs_train_as_torch_ddp(pool2):
    truth = assert_verdicts_equal_truth(pool2, "make_two_inputs", {"plain": PLAIN, "ddp": DDP, "overlap": OVERLAP})
    assert trains_as_ddp(truth, "plain")


def test_a_factory_declares_find_unused_parameters_and_a_set_still_wins(no_ranks):
    r = resolve(Selection(models=(f"{MODELS}:make_unused",), size="tiny", device="cpu"))
    assert all(rc.config.find_unused_parameters for rc in r.at[2])
    r = resolve(Selection(models=(f"{MODELS}:make_unused",), size="tiny", device="cpu",
                          sets=("find_unused_parameters=false",)))
    assert not any(rc.config.find_unused_parameters for rc in r.at[2])


def test_build_is_told_the_rank():
    spec = get_model(f"{MODELS}:make_differs", "tiny")
    assert spec.make(0, rank=0).embedding.weight.shape == (16, 10)
    assert spec.make(0, rank=1).embedding.weight.shape == (8, 10)
    assert F.cross_entropy  # the models' loss
