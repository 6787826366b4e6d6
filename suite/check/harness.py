"""The correctness harness: run a config for K steps and compare, at every step, each rank's
loss, parameters and buffers with the single-process reference that fits the strategy.

Runs on every rank (:func:`check_on_rank`, through the rank pool or under torchrun); the
parent folds the ranks' answers into one :class:`CheckResult` (:func:`summarize`).
Ranks are deliberately initialised differently: the engine's broadcast from rank 0 must
make them agree.  Global batches are reshuffled every step.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..config import StrategyConfig
from ..engine import strict_fp32
from ..workload import WorkloadSpec, workload
from .errors import max_finite, rel_error, worst_error
from .reference import make_reference
from .tolerances import tolerance_for

__all__ = ["CheckResult", "check_on_rank", "summarize", "run_check"]


@dataclass
class CheckResult:
    verdict: str  # "pass" | "fail" | "n/a" | "error"
    reference: str = ""
    tolerance_key: str = ""
    param_tol: float = 0.0
    loss_tol: float = 0.0
    param_error: float = math.inf
    param_error_at: str = ""
    loss_error: float = math.inf
    buffer_error: float = 0.0
    ranks_identical: bool = False
    steps: int = 0
    per_step: list = field(default_factory=list)
    losses: list = field(default_factory=list)  # rank 0's loss at each step (the structural gate compares them)
    precision: str = "float32"  # the dtype the check ran in (float64 for BatchNorm models: check_precision)
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("param_error", "loss_error", "buffer_error"):
            if not math.isfinite(d[k]):
                d[k] = str(d[k])  # JSON has no inf/nan
        return d


def _digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def check_precision(config: StrategyConfig, has_batchnorm: bool) -> torch.dtype:
    """The dtype the check runs in: float64 for models with BatchNorm when the config is fp32 end to end.

    BatchNorm's normalisation divides by a shard's standard deviation, which turns the
    summation-order noise of an allreduce over 4 ranks into parameter differences of ~1e-5
    relative at a BN bias after three steps (measured: 1.3e-5 at ``layers.0.bn2.bias`` of the
    small ResNet, adaptive Local SGD, world 4).  That is float32's rounding, not the strategy:
    the same check in float64 leaves ~1e-13.  So the engine and the reference both run in
    float64 there, and the fp32 tolerance (1e-5) stays as it is.  Half precision (AMP, gradients
    sent in bf16/fp16) keeps float32 masters and its own tolerances.
    """
    if has_batchnorm and config.amp == "off" and config.grad_comm_dtype == "fp32":
        return torch.float64
    return torch.float32


def check_on_rank(workload_spec: WorkloadSpec, config: dict, steps: int = 3) -> dict:
    """Train ``steps`` steps with the engine and the reference side by side on this rank."""
    wl = workload(workload_spec)
    world, rank, seed = wl.world, wl.rank, wl.ws.seed
    cfg = strict_fp32(StrategyConfig.from_dict(config))  # checks run TF32 off, whatever the timing uses
    dtype = check_precision(cfg, wl.spec.has_batchnorm)
    cast = dtype if dtype != torch.float32 else None
    engine = wl.engine(cfg, seed=seed + 7919 * rank, dtype=cast)  # ranks start different on purpose
    reference = make_reference(wl.module(seed, cast), wl.spec.loss_fn, cfg, world)
    per_step = []
    for step in range(steps):
        shards = wl.shards(step, cast)
        loss = engine.train_step(*shards[rank]).item()
        expected = reference.step(shards)
        params = dict(engine.module.named_parameters())
        p_err, p_at = worst_error(params, expected.params_for(rank))
        l_ref = expected.losses[rank]
        l_err = rel_error(torch.tensor(loss), torch.tensor(l_ref))
        b_err = 0.0
        if expected.buffers:
            b_err, _ = worst_error(dict(engine.module.named_buffers()), expected.buffers[rank])
        per_step.append({
            "step": step + 1, "loss": loss, "ref_loss": l_ref, "loss_error": l_err, "param_error": p_err,
            "param_error_at": p_at, "buffer_error": b_err, "digest": _digest(engine.module),
            "expect_identical": len(expected.params) == 1,
        })
    return {"rank": rank, "reference": type(reference).__name__, "per_step": per_step, "describe": engine.describe(),
            "precision": str(dtype).removeprefix("torch.")}


def summarize(config: StrategyConfig, answers: list[dict]) -> CheckResult:
    """Fold every rank's answer into one verdict against the tolerance table."""
    key, p_tol, l_tol = tolerance_for(config)
    steps = len(answers[0]["per_step"])
    per_step, identical, problems = [], True, []
    for s in range(steps):
        rows = [a["per_step"][s] for a in answers]
        p_err = max_finite(r["param_error"] for r in rows)
        l_err = max_finite(r["loss_error"] for r in rows)
        b_err = max_finite(r["buffer_error"] for r in rows)
        same = len({r["digest"] for r in rows}) == 1
        if rows[0]["expect_identical"] and not same:
            identical = False
            problems.append(f"step {s + 1}: ranks hold different parameters")
        bad = [a["rank"] for a, r in zip(answers, rows) if not math.isfinite(r["loss"])]
        if bad:
            problems.append(f"step {s + 1}: non-finite loss on rank(s) {bad}")
        worst_at = max(rows, key=lambda r: r["param_error"] if math.isfinite(r["param_error"]) else math.inf)
        per_step.append({"step": s + 1, "param_error": p_err, "loss_error": l_err, "buffer_error": b_err,
                         "ranks_identical": same, "worst_param": worst_at["param_error_at"]})
    p_err = max_finite(r["param_error"] for r in per_step)
    l_err = max_finite(r["loss_error"] for r in per_step)
    b_err = max_finite(r["buffer_error"] for r in per_step)
    at = next((r["worst_param"] for r in per_step if r["param_error"] == p_err), "")
    if not (p_err <= p_tol):
        problems.append(f"parameter error {p_err:.3g} > {p_tol:g} (worst at {at!r})")
    if not (l_err <= l_tol):
        problems.append(f"loss error {l_err:.3g} > {l_tol:g}")
    if not (b_err <= p_tol):
        problems.append(f"buffer error {b_err:.3g} > {p_tol:g}")
    return CheckResult(
        verdict="fail" if problems else "pass", reference=answers[0]["reference"], tolerance_key=key,
        param_tol=p_tol, loss_tol=l_tol, param_error=p_err, param_error_at=at, loss_error=l_err,
        buffer_error=b_err, ranks_identical=identical, steps=steps, per_step=per_step,
        losses=[r["loss"] for r in answers[0]["per_step"]], precision=answers[0].get("precision", "float32"),
        message="; ".join(problems),
    )


def run_check(launcher: Any, workload_spec: WorkloadSpec, config: StrategyConfig, steps: int = 3,
              fn: Callable[..., dict] = check_on_rank, timeout: float | None = None) -> CheckResult | None:
    """Run the check through ``launcher`` (a RankPool, or the torchrun launcher) and summarise it.

    None on a non-reporting torchrun rank (rank 0 reports)."""
    if config.data_parallel == "none":
        return CheckResult(verdict="n/a", message="data_parallel='none' communicates nothing: no reference to match")
    answers = launcher.run(fn, dict(workload_spec=workload_spec, config=config.to_dict(), steps=steps),
                           timeout=timeout)
    if answers is None:  # a non-zero torchrun rank: rank 0 reports
        return None
    return summarize(config, answers)
