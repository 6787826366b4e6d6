"""AMP against fp32: step time, and bytes communicated with and without half-precision gradient
communication (``grad_comm_dtype``)."""
from __future__ import annotations

from ..measure.timing import time_on_rank
from ..workload import WorkloadSpec
from .compute import timing_table

DESCRIPTION = "AMP (bf16) vs fp32 step time; gradient bytes communicated with/without bf16 gradient communication"

VARIANTS = [
    ("fp32", {}),
    ("fp32 + bf16 grads on the wire", dict(grad_comm_dtype="bf16")),
    ("amp bf16", dict(amp="bf16")),
    ("amp bf16 + bf16 grads on the wire", dict(amp="bf16", grad_comm_dtype="bf16")),
    ("amp bf16 + dynamic loss scaling", dict(amp="bf16", use_dynamic_loss_scaling=True)),
]


def _bytes(name: str, s: dict) -> str:
    b = sum(v for k, v in s["comm_bytes_per_step"].items() if k.endswith("/all_reduce"))
    return f"{b / 2**20:.2f}"


def run(pool, args) -> str:
    rounds, steps, nproc = args.rounds, args.steps, pool.nproc
    out = []
    for model, batch in (("resnet", 16), ("mlp", 32)):
        variants = [{"name": n, "config": c} for n, c in VARIANTS]
        answers = pool.run(time_on_rank,
                           dict(workload_spec=WorkloadSpec(model, per_rank_batch=batch), variants=variants,
                                warmup=2, steps=steps, rounds=rounds))
        out.append(f"### AMP on the {model} ({nproc} ranks, batch {batch}/rank, plain allreduce; "
                   f"{rounds} interleaved rounds of {steps} steps)")
        out.append(timing_table(answers, [n for n, _ in VARIANTS], batch * nproc, steps, "fp32",
                                {"allreduce MiB/step": _bytes}))
    out.append("`allreduce MiB/step` counts every allreduce through `suite.comm.collectives` on rank 0 (the "
               "found-inf flag of loss scaling adds one 4-byte allreduce per step).")
    return "\n\n".join(out)
