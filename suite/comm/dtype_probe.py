"""Can this backend reduce a dtype?  Probed once per (backend, dtype), with a clear error if not.

Gradients travel in ``grad_comm_dtype`` (bf16/fp16) while master weights stay fp32.  Some
backends cannot sum some dtypes (gloo and bf16 in some torch versions; float8 in gloo here):
a one-element allreduce at set-up finds out, on every rank at once, before training starts.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from . import collectives as C

__all__ = ["check_reducible", "ReduceDtypeError"]

_CACHE: dict = {}


class ReduceDtypeError(ValueError):
    """The process group's backend cannot allreduce the requested dtype."""


def check_reducible(dtype: torch.dtype, group=None, field: str = "grad_comm_dtype", value: str = "",
                    device=None) -> None:
    backend = dist.get_backend(group)
    key = (backend, dtype, str(device))
    if key not in _CACHE:
        probe = torch.zeros(1, dtype=torch.float32, device=device).to(dtype)
        try:
            C.all_reduce(probe, group=group)
            _CACHE[key] = None
        except RuntimeError as exc:
            _CACHE[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    reason = _CACHE[key]
    if reason is not None:
        raise ReduceDtypeError(
            f"{field}={value or str(dtype)!r}: the {backend} backend of torch {torch.__version__} cannot "
            f"allreduce {dtype} ({reason}); allowed here: 'fp32' or a half type this backend can reduce "
            f"(fp16 works on gloo and nccl)"
        )
