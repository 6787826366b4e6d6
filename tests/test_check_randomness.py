"""Models with dropout (and any per-rank randomness) are checked: each rank's generators are set from (seed, rank,
step) before its forward and the reference replays each shard with that rank's state; a model whose two
identical runs differ gets one "cannot judge" message, not a fail per case; BatchNorm is found without being
declared.  The factories are tests/scripts/my_models.py's (the README's example module)."""
from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

import suite.runtime
from suite.check.harness import CANNOT_JUDGE, run_check, summarize
from suite.cli.main import main
from suite.config import StrategyConfig
from suite.models import ModelSpec, get_model, model_info
from suite.run_spec import Selection
from suite.runtime.rng import step_seed
from suite.selection import base_cases
from suite.workload import WorkloadSpec
from tests.fakes import Borrowed
from tests.scripts import my_models

MODELS = "tests.scripts.my_models"
OVERLAP = StrategyConfig(fuse_all_reduce_ops=True, fuse_grad_size_in_MB=0.004, sync_nccl_allreduce=False)


def test_step_seeds_differ_by_seed_rank_and_step():
    seeds = {step_seed(s, r, t) for s in range(3) for r in range(8) for t in range(50)}
    assert len(seeds) == 3 * 8 * 50 and all(0 <= x < 2**63 for x in seeds)
    assert step_seed(0, 1, 2) == step_seed(0, 1, 2)


def test_training_mode_loss_with_dropout_differs_from_without():
    """The mutation the check must notice: p=0.1 in training mode changes the loss (p=0 and eval mode do not)."""
    on, off = my_models.make_dropout("tiny"), my_models.make_no_dropout("tiny")
    x, y = on.dataset(8, 0).get(torch.arange(4))
    a, b = on.make(0), off.make(0)
    torch.manual_seed(3)
    loss_on = on.loss_fn(a(x), y)
    torch.manual_seed(3)
    loss_off = off.loss_fn(b(x), y)
    assert not torch.equal(loss_on, loss_off)
    a.eval(), b.eval()
    assert torch.equal(on.loss_fn(a(x), y), off.loss_fn(b(x), y))


def test_a_dropout_model_passes_the_check_at_world_2(pool2):
    """nn.Dropout(0.1) in attention and MLP and DropPath(0.1): plain and overlapped buckets match the reference
    exactly, and the losses differ from the same block's at p=0 (dropout was on in the check)."""
    spec = WorkloadSpec(f"{MODELS}:make_dropout", size="tiny")
    losses = {}
    for cfg in (StrategyConfig(), OVERLAP):
        res = run_check(pool2, spec, cfg, steps=3)
        assert res.verdict == "pass" and res.ranks_identical, res.message
        losses[cfg.sync_nccl_allreduce] = res.losses
    off = run_check(pool2, WorkloadSpec(f"{MODELS}:make_no_dropout", size="tiny"), StrategyConfig(), steps=3)
    assert off.verdict == "pass" and off.losses != losses[True]


def wrong_rank_check_on_rank(**kwargs) -> dict:
    """check_on_rank with the reference replaying each shard with the next rank's random state."""
    from suite.check import reference
    from suite.check.harness import check_on_rank

    saved = reference.Replay.state_of

    def other_rank(self, rank):
        saved(self, (rank + 1) % 2)

    reference.Replay.state_of = other_rank
    try:
        return check_on_rank(**kwargs)
    finally:
        reference.Replay.state_of = saved


def test_replaying_a_shard_with_another_ranks_random_state_fails_the_check(pool2):
    cfg = StrategyConfig()
    answers = pool2.run(wrong_rank_check_on_rank, dict(workload_spec=WorkloadSpec(f"{MODELS}:make_dropout",
                                                                                  size="tiny"),
                                                       config=cfg.to_dict(), steps=3))
    res = summarize(cfg, answers)
    assert res.verdict == "fail" and "loss error" in res.message, res.message


def test_a_model_whose_identical_runs_differ_gets_one_message_not_a_fail_per_case(pool2, monkeypatch, tmp_path):
    """An unseeded private generator: the check cannot judge it; said once, with why; every case n/a; exit 0."""
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pool2))
    results = tmp_path / "runs.jsonl"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["run", "--model", f"{MODELS}:make_noisy", "--size", "tiny", "--case", "*/plain", "--case",
                   "*/fusion", "--case", "*/ddp", "--rounds", "1", "--steps", "1", "--warmup", "0",
                   "--no-utilization", "--results", str(results)])
    text = out.getvalue()
    assert rc == 0, text
    assert text.count(CANNOT_JUDGE) == 4, text  # the message once, and each case's line naming it
    assert text.count("two identical runs of its first step differ") == 1, text
    assert "unseeded generator" in text, text
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    assert {r["case"] for r in recs} == {f"my_models.make_noisy/{v}" for v in ("plain", "fusion", "ddp")}
    assert all(r["verdict"] == "n/a" and r["check"]["message"].startswith(CANNOT_JUDGE) for r in recs), recs


class Jittery(torch.nn.Module):
    """Run-to-run noise of about 1e-4 relative (a private generator seeded from the OS): what a non-deterministic
    kernel leaves, above fp32's tolerance (1e-5), below AMP's (1e-3)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 4)
        self.noise = torch.Generator()
        self.noise.seed()

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h * (1 + 1e-4 * torch.randn(h.shape, generator=self.noise)))


def make_jittery(size: str = "cpu"):
    return ModelSpec("jittery", Jittery, torch.nn.functional.cross_entropy, lambda n, seed: my_models.Blobs(n, seed),
                     data="other", size=size, per_rank_batch=8, dataset_size=256)


def probe_on_rank(workload_spec, config: dict) -> dict:
    """check_on_rank (one step) with torch's switches at what a process starts with on CUDA and more (cuDNN TF32
    and autotuning on, matmuls 'high'), the repeatability probe's view of them recorded; the switches put back."""
    from suite.check import harness

    cudnn, seen, probe = torch.backends.cudnn, [], harness.repeatable
    before = (cudnn.allow_tf32, cudnn.benchmark, cudnn.deterministic, torch.get_float32_matmul_precision())

    def recording(wl, dtype=None, tolerance="fp32"):
        seen.append(dict(tolerance=tolerance, tf32=cudnn.allow_tf32, benchmark=cudnn.benchmark,
                         deterministic=cudnn.deterministic, matmul=torch.get_float32_matmul_precision()))
        return probe(wl, dtype, tolerance)

    cudnn.set_flags(_allow_tf32=True, _benchmark=True, _deterministic=False, _fp32_precision=None)
    torch.set_float32_matmul_precision("high")
    harness.repeatable = recording
    try:
        answer = harness.check_on_rank(workload_spec, config, steps=1)
    finally:
        harness.repeatable = probe
        cudnn.set_flags(_allow_tf32=before[0], _benchmark=before[1], _deterministic=before[2], _fp32_precision=None)
        torch.set_float32_matmul_precision(before[3])
    return {"seen": seen, "cannot_judge": answer.get("cannot_judge")}


def test_the_repeatability_probe_runs_as_the_check_does_and_judges_noise_by_the_checks_tolerance(pool2):
    """The second H200 run: resnet50's AMP case was called unjudgeable from cuDNN's TF32 noise, probed under the
    process's switches against fp32's tolerance, and every later case of the model (fp64 checks among them) with
    it.  The probe runs under the check's switches (TF32 off, deterministic cuDNN, no autotuning) and against the
    tolerance of the check that will judge the case."""
    spec = WorkloadSpec("tests.test_check_randomness:make_jittery", size="tiny")
    fp32 = pool2.run(probe_on_rank, dict(workload_spec=spec, config=StrategyConfig().to_dict()))
    amp = pool2.run(probe_on_rank, dict(workload_spec=spec, config=StrategyConfig(amp="bf16").to_dict()))
    strict = dict(tf32=False, benchmark=False, deterministic=True, matmul="highest")
    assert [a["seen"] for a in fp32] == [[dict(tolerance="fp32", **strict)]] * 2, fp32
    assert [a["seen"] for a in amp] == [[dict(tolerance="amp", **strict)]] * 2, amp
    assert all(a["cannot_judge"] for a in fp32), fp32  # 1e-4 of noise: more than fp32's 1e-5
    assert not any(a["cannot_judge"] for a in amp), amp  # less than AMP's 1e-3


def test_batchnorm_is_found_without_being_declared(pool2):
    """make_normed leaves has_batchnorm False: its cases still include BatchNorm's, and its check runs in float64."""
    assert get_model(f"{MODELS}:make_normed", "tiny").has_batchnorm is False
    assert model_info(f"{MODELS}:make_normed", "tiny").has_batchnorm
    cases = base_cases(Selection(models=(f"{MODELS}:make_normed",), size="tiny"), "tiny")
    assert {"my_models.make_normed/compute_fusion", "my_models.make_normed/fused_broadcast"} <= {c.name for c in cases}
    res = run_check(pool2, WorkloadSpec(f"{MODELS}:make_normed", size="tiny"), StrategyConfig(), steps=2)
    assert res.verdict == "pass" and res.precision == "float64", (res.verdict, res.precision, res.message)


@pytest.mark.heavy  # every case of a dropout model at worlds 2 and 4 through `fleetbench run`: make test-slow
@pytest.mark.parametrize("world", [2, 4])
def test_every_case_of_a_dropout_model_passes(pools, monkeypatch, tmp_path, world):
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pools(world)))
    results = tmp_path / "runs.jsonl"
    rc = main(["run", "--model", f"{MODELS}:make_dropout", "--size", "tiny", "--nproc", str(world), "--rounds", "1",
               "--steps", "1", "--warmup", "0", "--no-utilization", "--results", str(results)])
    recs = [json.loads(line) for line in results.read_text().splitlines()]
    ran = [r for r in recs if r["verdict"] != "skipped"]
    assert rc == 0 and len(ran) >= 10, [(r["case"], r["verdict"], r.get("error")) for r in recs]
    assert all(r["verdict"] in ("pass", "n/a") for r in ran), [(r["case"], r["verdict"], r.get("error")) for r in ran]
    assert all(r["verdict"] == "pass" for r in ran if not r["case"].endswith("/none"))


def test_a_model_unjudgeable_at_fp32s_tolerance_is_still_checked_in_amp(pool2, monkeypatch, tmp_path):
    """The runner reuses a model's "cannot judge" for the cases checked alike (same tolerance), not for all of it."""
    monkeypatch.setattr(suite.runtime, "RankPool", lambda *a, **k: Borrowed(pool2))
    results = tmp_path / "runs.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["run", "--model", "tests.test_check_randomness:make_jittery", "--size", "tiny", "--case",
                   "*/plain", "--case", "*/amp_bf16", "--case", "*/ddp", "--rounds", "1", "--steps", "1",
                   "--warmup", "0", "--no-utilization", "--results", str(results)])
    verdicts = {r["case"].split("/")[1]: r["verdict"] for r in map(json.loads, results.read_text().splitlines())}
    assert rc == 0 and verdicts == {"plain": "n/a", "ddp": "n/a", "amp_bf16": "pass"}, verdicts
