"""AMP against fp32: step time, and bytes communicated with and without half-precision gradient
communication (``grad_comm_dtype``)."""
from __future__ import annotations

from dataclasses import dataclass

from ..measure.timing import RankTiming, time_on_rank
from ..results.records import Metrics
from ..workload import WorkloadSpec
from . import PoolOptions
from .compute import timing_table

DESCRIPTION = "AMP (bf16) vs fp32 step time; gradient bytes communicated with/without bf16 gradient communication"

VARIANTS = [
    ("fp32", {}),
    ("fp32 + bf16 grads on the wire", dict(grad_comm_dtype="bf16")),
    ("amp bf16", dict(amp="bf16")),
    ("amp bf16 + bf16 grads on the wire", dict(amp="bf16", grad_comm_dtype="bf16")),
    ("amp bf16 + dynamic loss scaling", dict(amp="bf16", use_dynamic_loss_scaling=True)),
]


def _bytes(name: str, s: Metrics) -> str:
    b = sum(v for k, v in (s.comm_bytes_per_step or {}).items() if k.endswith("/all_reduce"))
    return f"{b / 2**20:.2f}"


@dataclass(frozen=True)
class Options(PoolOptions):
    """The pool's options (``PoolOptions``), nothing of its own."""


MODELS = (("resnet", 16), ("mlp", 32))  # (model, per-rank batch)


def measure(options: Options, pool) -> dict:
    """The ranks' interleaved timings of every variant, per model (JSON-able)."""
    variants = [{"name": n, "config": c} for n, c in VARIANTS]

    def timed(model: str, batch: int) -> list[dict]:
        return [a.to_dict() for a in pool.run(time_on_rank, dict(
            workload_spec=WorkloadSpec(model, per_rank_batch=batch), variants=variants, warmup=2, steps=options.steps,
            rounds=options.rounds))]

    return {"world": pool.nproc, "answers": {model: timed(model, batch) for model, batch in MODELS}}


def render(raw: dict, options: Options) -> str:
    rounds, steps, nproc = options.rounds, options.steps, raw["world"]
    out = []
    for model, batch in MODELS:
        out.append(f"### AMP on the {model} ({nproc} ranks, batch {batch}/rank, plain allreduce; "
                   f"{rounds} interleaved rounds of {steps} steps)")
        answers = [RankTiming.from_dict(a) for a in raw["answers"][model]]
        out.append(timing_table(answers, [n for n, _ in VARIANTS], batch * nproc, steps, "fp32",
                                {"allreduce MiB/step": _bytes}))
    out.append("`allreduce MiB/step` counts every allreduce through `suite.comm.collectives` on rank 0 (the "
               "found-inf flag of loss scaling adds one 4-byte allreduce per step).")
    return "\n\n".join(out)
