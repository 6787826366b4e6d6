"""The correctness harness: run a config for K steps and compare, at every step, each rank's
loss, parameters and buffers with the single-process reference that fits the strategy.

Runs on every rank (:func:`check_on_rank`, through the rank pool or under torchrun); the
parent folds the ranks' answers into one ``suite.results.records.CheckSummary`` (:func:`summarize`), the
type the record keeps as it is.
Ranks are deliberately initialised differently: the engine's broadcast from rank 0 must
make them agree.  Global batches are reshuffled every step.  The check's engine compares, every
step before any gradient collective, which parameters each rank uses (``verify_gradients``):
ranks that take different branches all stop with the fix instead of one waiting for the other.

Randomness: the engine sets each rank's generators from (seed, rank, step) before its forward and
the reference replays each shard with that rank's state (``suite.runtime.rng``), so dropout and
DropPath pass exactly.  A model whose randomness lies outside torch's default generators (a private
or unseeded generator, Python's ``random``) or whose kernels are not deterministic cannot be matched
by any reference: before its first check, each rank runs the model's first step twice from the same
seed and state (:func:`repeatable`, once per model, dtype and rank); if two identical runs differ, the
check answers ``n/a`` with :data:`CANNOT_JUDGE` and why, instead of a ``fail`` per case.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from typing import Any

import torch

from ..comm import collectives as C
from ..config import StrategyConfig
from ..engine import apply_precision, call_model, strict_fp32
from ..results.records import CheckSummary
from ..runtime.rng import seed_step
from ..strategies.user import BoundedError, CheckKind, Convergence, Exact
from ..workload import Workload, WorkloadSpec, workload
from .errors import finite_le, max_finite, rel_error, worst_error
from .reference import make_reference
from .tolerances import TOLERANCES, tolerance_for, tolerance_key

__all__ = ["check_on_rank", "summarize", "run_check", "repeatable", "param_digest", "CANNOT_JUDGE"]

CANNOT_JUDGE = "the check cannot judge this model"  # the start of an n/a check's message (the runner says it once)


_CHUNK = 1 << 20  # elements per partial sum of the digest: a weighted sum of 2**20 words stays below 2**63
_WEIGHTS: dict = {}  # device -> the digest's position weights (int64, 1..2039), made once per device


def param_digest(module: torch.nn.Module) -> str:
    """The bits of every parameter, summarised on its device: the ranks hold identical parameters when their
    digests agree (what the check's "ranks identical" compares, step by step).

    Each parameter's bytes are read as integer words (int32; int16 for 2-byte dtypes) and summed per chunk of
    :data:`_CHUNK` words twice, plainly and weighted by position (1..2039): exact integer sums (no overflow, no
    rounding, the same in any summation order), so a changed bit always changes the digest, and a change that
    cancels out in both sums would have to be contrived.  The sums stay on the device; one small tensor of them
    (4 values per MiB of parameters) is copied to the host and hashed there with the names and shapes: no
    parameter is copied to the host (the previous digest copied and hashed every parameter at every check step).
    """
    sums, labels = [], []
    for name, p in sorted(module.named_parameters()):
        flat = p.detach().reshape(-1)
        words = flat.view(torch.int32) if flat.element_size() % 4 == 0 else flat.view(torch.int16)
        weights = _WEIGHTS.get(words.device)
        if weights is None:
            weights = _WEIGHTS[words.device] = torch.arange(_CHUNK, dtype=torch.int64, device=words.device) \
                .mul_(40503).remainder_(2039).add_(1)
        for start in range(0, words.numel(), _CHUNK):
            w = words[start:start + _CHUNK]
            sums.append(torch.stack([w.sum(dtype=torch.int64), (w * weights[:w.numel()]).sum()]))
        labels.append(f"{name}:{tuple(p.shape)}:{p.dtype}")
    h = hashlib.sha256("\n".join(labels).encode())
    if sums:
        h.update(torch.stack(sums).cpu().numpy().tobytes())  # the one host copy: two integers per chunk
    return h.hexdigest()


_digest = param_digest  # the name the check and the tests use


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


def repeatable(wl: Workload, dtype: torch.dtype | None = None, tolerance: str = "fp32") -> str | None:
    """None when two identical runs of the model's first step agree on this rank (within ``tolerance``, the
    tolerance of the check that will judge it), else why not: the model built twice from one seed, this rank's
    first shard, the same generator state, under the precision switches in effect (the check's: the caller sets
    them)."""
    runs = []
    for _ in range(2):
        module = wl.module(wl.ws.seed, dtype)
        inputs, targets = wl.shard_of(0, wl.rank, dtype)
        seed_step(wl.ws.seed, wl.rank, 1, wl.device)
        loss = wl.spec.loss_fn(call_model(module, inputs), targets)
        loss.backward()
        runs.append((loss.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}))
    (loss_a, grads_a), (loss_b, grads_b) = runs
    if not (torch.isfinite(loss_a) and torch.isfinite(loss_b)):
        return None  # a non-finite loss is the check's to fail, not a reason it cannot judge
    p_tol, l_tol = TOLERANCES[tolerance]
    l_err = rel_error(loss_a, loss_b)
    g_err, at = worst_error(grads_a, grads_b)
    if l_err <= l_tol and g_err <= p_tol:
        return None
    return (f"two identical runs of its first step differ on rank {wl.rank} (loss {loss_a.item():.6g} vs "
            f"{loss_b.item():.6g}; the gradient of {at!r} by {g_err:.2g}, relative): it draws randomness outside "
            f"torch's default generators (a private or unseeded generator, Python's or NumPy's random), or runs "
            f"kernels that are not deterministic, so no reference can match it; its cases are timed unchecked")


def _judgeable(wl: Workload, dtype: torch.dtype | None, tolerance: str) -> str | None:
    """:func:`repeatable` on every rank, once per model, dtype and tolerance; the ranks agree (one collective), so
    all of them stop or go on together."""
    key = f"{dtype}/{tolerance}"
    if key not in wl.repeatable:
        why = repeatable(wl, dtype, tolerance)
        flag = torch.tensor([1.0 if why else 0.0], device=wl.device)
        C.all_reduce(flag)
        wl.repeatable[key] = why or ("on another rank" if flag.item() > 0 else None)
    return wl.repeatable[key]


def _exact_gradients(wl: Workload, reference: torch.nn.Module, engine: Any, shards: list,
                     dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The exact average of every rank's gradient on ``engine``'s parameters as they are now (before its optimizer):
    ``reference`` given the engine's state, each rank's shard forward and backward with that rank's randomness, the
    sum times 1/world (a multiplier: the check divides by no Python number)."""
    reference.load_state_dict(engine.module.state_dict())
    reference.zero_grad(set_to_none=True)
    for r, (inputs, targets) in enumerate(shards):
        if engine.rng_seed is not None:
            seed_step(engine.rng_seed, r, engine.steps, wl.device)
        wl.spec.loss_fn(call_model(reference, inputs), targets).backward()
    scale = 1.0 / len(shards)
    return {n: p.grad * scale for n, p in reference.named_parameters() if p.grad is not None}


def declared_check(engine: Any) -> CheckKind:
    """The check the engine's strategy declares (a user's, or torch's hooks': suite/strategies/user.py); the
    built-in strategies are exact."""
    return engine.strategy.check if getattr(engine, "strategy", None) is not None else Exact()


def check_on_rank(workload_spec: WorkloadSpec, config: dict, steps: int = 3) -> dict:
    """Train ``steps`` steps with the engine and the reference side by side on this rank, as the engine's strategy
    declares it is checked (``Exact``: the reference's parameters, loss and buffers; ``BoundedError``: each step's
    averaged gradients against their exact average on the same parameters; ``Convergence``: the loss over its own
    number of steps)."""
    wl = workload(workload_spec)
    world, rank, seed = wl.world, wl.rank, wl.ws.seed
    cfg = strict_fp32(StrategyConfig.from_dict(config))  # checks run TF32 off, whatever the timing uses
    dtype = check_precision(cfg, wl.has_batchnorm)
    cast = dtype if dtype != torch.float32 else None
    # the repeatability probe runs under the check's switches, not the process's (torch's defaults let cuDNN
    # convolutions use TF32: an H200 run called resnet50's AMP case unjudgeable from that noise alone)
    apply_precision(cfg)
    why = _judgeable(wl, cast, tolerance_key(cfg))
    if why is not None:
        return {"rank": rank, "cannot_judge": why, "per_step": [], "precision": str(dtype).removeprefix("torch.")}
    # ranks start different on purpose; every step the ranks compare the parameters they use before any gradient
    # collective (verify_gradients): ranks that take different branches all stop, with the fix, instead of hanging
    engine = wl.engine(cfg, seed=seed + 7919 * rank, dtype=cast, verify_gradients=True)
    # the reference is rank 0's model (a build told the rank: the engine broadcast rank 0's state)
    reference = make_reference(wl.module(seed, cast, rank=0), wl.spec.loss_fn, cfg, world, rng_seed=seed)
    declared = declared_check(engine)
    if isinstance(declared, Convergence):
        steps = max(steps, declared.steps)
    exact_copy = wl.module(seed, cast, rank=0) if isinstance(declared, BoundedError) else None
    per_step = []
    for step in range(steps):
        shards = wl.shards(step, cast)
        grad: list = []

        def compare(e: Any, shards: list = shards, grad: list = grad) -> None:  # averaged: before the optimizer
            assert exact_copy is not None
            got = {n: p.grad for n, p in e.module.named_parameters() if p.grad is not None}
            grad.extend(worst_error(got, _exact_gradients(wl, exact_copy, e, shards, cast)))

        loss = engine.train_step(*shards[rank], after_sync=compare if exact_copy is not None else None).item()
        expected = reference.step(shards)
        params = dict(engine.module.named_parameters())
        p_err, p_at = worst_error(params, expected.params_for(rank))
        l_ref = expected.losses[rank]
        l_err = rel_error(torch.tensor(loss), torch.tensor(l_ref))
        b_err = 0.0
        if expected.buffers:
            b_err, _ = worst_error(dict(engine.module.named_buffers()), expected.buffers[rank])
        row = {"step": step + 1, "loss": loss, "ref_loss": l_ref, "loss_error": l_err, "param_error": p_err,
               "param_error_at": p_at, "buffer_error": b_err, "digest": _digest(engine.module),
               "expect_identical": len(expected.params) == 1 and getattr(declared, "ranks_identical", True)}
        if grad:
            row.update(grad_error=grad[0], grad_error_at=grad[1])
        per_step.append(row)
    return {"rank": rank, "reference": type(reference).__name__, "per_step": per_step, "describe": engine.describe(),
            "precision": str(dtype).removeprefix("torch."), "kind": declared.kind,
            "bound": getattr(declared, "rel", getattr(declared, "band", None)), "strategy": cfg.strategy}


LOSSY_HINT = ("if the strategy is lossy by design, declare its check: check=BoundedError(rel=...) (each step's "
              "averaged gradient within rel of the exact one) or check=Convergence(steps=..., band=...) (the loss "
              "within band of the exact reference's): docs/strategies.md")


def summarize(config: StrategyConfig, answers: list[dict],
              observe: Callable[[dict], str | None] | None = None) -> CheckSummary:
    """Fold every rank's answer into one verdict against the tolerance table; ``observe`` (the runner's: does what the
    engine built and did in the check's steps match the case's plan?) turns its answer into a failure, so a check
    never passes a case that then fails on what its own steps showed (a check in float32, the plan's dtype)."""
    key, p_tol, l_tol = tolerance_for(config)
    said = [a["cannot_judge"] for a in answers if a.get("cannot_judge") and a["cannot_judge"] != "on another rank"]
    if any(a.get("cannot_judge") for a in answers):
        return CheckSummary(verdict="n/a", tolerance_key=key, param_tol=p_tol, loss_tol=l_tol,
                           precision=answers[0].get("precision", "float32"),
                           message=f"{CANNOT_JUDGE}: {said[0] if said else 'two identical runs differ'}")
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
        entry = {"step": s + 1, "param_error": p_err, "loss_error": l_err, "buffer_error": b_err,
                 "ranks_identical": same, "worst_param": worst_at["param_error_at"]}
        if "grad_error" in rows[0]:
            g_at = max(rows, key=lambda r: r["grad_error"] if math.isfinite(r["grad_error"]) else math.inf)
            entry.update(grad_error=max_finite(r["grad_error"] for r in rows), worst_grad=g_at["grad_error_at"])
        per_step.append(entry)
    p_err = max_finite(r["param_error"] for r in per_step)
    l_err = max_finite(r["loss_error"] for r in per_step)
    b_err = max_finite(r["buffer_error"] for r in per_step)
    at = next((r["worst_param"] for r in per_step if r["param_error"] == p_err), "")
    at_step = next((r["step"] for r in per_step if r["param_error"] == p_err), 0)
    kind, bound = answers[0].get("kind", "exact"), float(answers[0].get("bound") or 0.0)
    if kind == "bounded error":  # the gradients against their exact average; the parameters drift, by design
        g_err = max_finite(r.get("grad_error", math.inf) for r in per_step)
        worst = next((r for r in per_step if r.get("grad_error") == g_err), per_step[-1] if per_step else {})
        p_tol, at, at_step, p_err = bound, worst.get("worst_grad", ""), worst.get("step", 0), g_err
        if not finite_le(g_err, bound):
            problems.append(f"averaged gradient error {g_err:.3g} > {bound:g} declared (worst at {at!r}, step "
                            f"{at_step})")
    elif kind == "convergence":  # the loss within its band of the exact reference's; parameters reported only
        l_tol = bound
        worst = next((r for r in per_step if r["loss_error"] == l_err), {})
        if not finite_le(l_err, bound):
            problems.append(f"loss {l_err:.3g} from the exact reference's > {bound:g} declared (step "
                            f"{worst.get('step', '?')})")
    else:
        if not (p_err <= p_tol):
            problems.append(f"parameter error {p_err:.3g} > {p_tol:g} (worst at {at!r}, step {at_step})")
        if not (l_err <= l_tol):
            problems.append(f"loss error {l_err:.3g} > {l_tol:g}")
        if not (b_err <= p_tol):
            problems.append(f"buffer error {b_err:.3g} > {p_tol:g}")
        if problems and answers[0].get("strategy"):
            problems.append(LOSSY_HINT)
    # the plan is the timing's (float32); a check run in float64 (BatchNorm models) has twice the bytes per bucket
    if observe is not None and answers[0].get("precision", "float32") == "float32" \
            and (differs := observe(answers[0].get("describe") or {})):
        problems.append(differs)
    return CheckSummary(
        verdict="fail" if problems else "pass", reference=answers[0]["reference"],
        tolerance_key=key if kind == "exact" else f"declared {kind}", kind=kind,
        param_tol=p_tol, loss_tol=l_tol, param_error=p_err, param_error_at=at, loss_error=l_err,
        buffer_error=b_err, ranks_identical=identical, steps=steps, per_step=per_step,
        losses=[r["loss"] for r in answers[0]["per_step"]], precision=answers[0].get("precision", "float32"),
        message="; ".join(problems),
    )


def run_check(launcher: Any, workload_spec: WorkloadSpec, config: StrategyConfig, steps: int = 3,
              fn: Callable[..., dict] = check_on_rank, timeout: float | None = None,
              observe: Callable[[dict], str | None] | None = None) -> CheckSummary | None:
    """Run the check through ``launcher`` (a RankPool, or the torchrun launcher) and summarise it (``observe``: see
    :func:`summarize`).

    None on a non-reporting torchrun rank (rank 0 reports)."""
    if config.data_parallel == "none":
        return CheckSummary(verdict="n/a", message="data_parallel='none' communicates nothing: no reference to match")
    answers = launcher.run(fn, dict(workload_spec=workload_spec, config=config.to_dict(), steps=steps),
                           timeout=timeout)
    if answers is None:  # a non-zero torchrun rank: rank 0 reports
        return None
    return summarize(config, answers, observe)
