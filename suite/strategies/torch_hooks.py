"""torch's own DDP communication hooks, as the registry's cases run them (``*/ddp_fp16_compress``,
``*/ddp_bf16_compress``, ``*/ddp_powersgd_r1``, ``*/ddp_powersgd_r4``): strategies of the one public protocol a
user's hook uses too (:mod:`suite.strategies.user`), each with the check it declares.

- ``fp16_compress`` / ``bf16_compress`` (``default_hooks.fp16_compress_hook``, ``bf16_compress_hook``): each bucket
  divided by the world size, cast to half precision, allreduced and cast back: lossy per element (fp16 keeps 11
  significant bits, 2^-11 = 4.9e-4 per rounding; bf16 8, 3.9e-3), identical on every rank.  Declared
  :class:`BoundedError`: 5e-3 (fp16) and 2e-2 (bf16) of each tensor's largest averaged gradient, a few roundings' worth.
  torch's DDP refuses ``bf16_compress_hook`` by its name unless torch is a CUDA build with NCCL 2.10+
  (``DistributedDataParallel._check_comm_hook``), though gloo allreduces bfloat16: on gloo the hook is called through
  a wrapper of another name (:func:`_bf16_compress_on_gloo`), the same computation; on NCCL torch's hook as it is.
- ``powersgd_r1`` / ``powersgd_r4`` (``powerSGD_hook``, rank 1 and 4): each bucket's matrices approximated by rank-r
  factors allreduced instead of the gradient, with error feedback and warm start (the factors of the last step reused),
  compressed from the 2nd step (``start_powerSGD_iter=2``, the earliest torch allows with error feedback; its default
  1000 would never compress within a check); tensors whose compression would save too little are allreduced as they
  are (``min_compression_rate=2``).  Lossy by design and not bounded per step: declared :class:`Convergence` over 8
  steps, the training loss within 5% of the exact reference's, the ranks identical (every rank averages the same
  factors).  On gloo the model is one DDP bucket (``bucket_cap_mb``): a bucket's second allreduce (its Q factors) is
  issued from a callback of its first, which gloo completes on a worker thread, so two buckets' chains could issue
  their allreduces in another order on each rank (seen here: "Received data size doesn't match expected size" and
  a rank aborted); NCCL's futures run the callback as the collective is queued, in order (torch's own tests of the
  hook run on NCCL).
"""
from __future__ import annotations

from .user import BoundedError, Convergence, DDPHook

__all__ = ["fp16_compress", "bf16_compress", "powersgd_r1", "powersgd_r4"]


def fp16_compress() -> DDPHook:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return DDPHook(default_hooks.fp16_compress_hook, name="ddp_fp16_compress", check=BoundedError(rel=5e-3),
                   description="torch DDP, gradients allreduced in fp16 (fp16_compress_hook)")


def bf16_compress() -> DDPHook:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    gloo = _on_gloo()
    return DDPHook(_bf16_compress_on_gloo if gloo else default_hooks.bf16_compress_hook, name="ddp_bf16_compress",
                   check=BoundedError(rel=2e-2),
                   description="torch DDP, gradients allreduced in bf16 (bf16_compress_hook"
                               + (", called through a wrapper: DDP refuses it by name without NCCL)" if gloo else ")"))


def _bf16_compress_on_gloo(process_group, bucket):  # no annotations: DDP checks only those it finds
    """torch's ``bf16_compress_hook``, unchanged, under a name DDP does not refuse on a CPU build (module docstring)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(process_group, bucket)


def _on_gloo() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_backend() == "gloo"


def _powersgd(rank: int) -> DDPHook:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    def make_state(group):
        return ps.PowerSGDState(process_group=group, matrix_approximation_rank=rank, start_powerSGD_iter=2,
                                min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=0)

    return DDPHook(ps.powerSGD_hook, make_state=make_state, name=f"ddp_powersgd_r{rank}",
                   ddp_kwargs={"bucket_cap_mb": 1_000_000} if _on_gloo() else {},
                   check=Convergence(steps=8, band=0.05, ranks_identical=True),
                   description=f"torch DDP with PowerSGD, rank {rank}, error feedback and warm start")


def powersgd_r1() -> DDPHook:
    return _powersgd(1)


def powersgd_r4() -> DDPHook:
    return _powersgd(4)
