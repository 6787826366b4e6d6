"""How many bytes autograd keeps for backward, measured with ``torch.autograd.graph.saved_tensors_hooks``.

Two figures, because they answer different questions:

- ``saved``: the sum over every tensor an op saves (a tensor saved by two ops counts twice).
  This is what "the op keeps fewer bytes for backward" means op by op.
- ``unique``: the bytes of the distinct storages kept alive for backward, i.e. the real
  activation memory.  A ReLU's output that the next conv also saves counts once here.

Parameters (and anything else passed as ``exclude``) are left out of both: they live anyway.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["SavedBytes", "measure_saved"]


@dataclass
class SavedBytes:
    saved: int = 0  # sum over every saved tensor (views counted by their own size)
    unique: int = 0  # distinct storages
    tensors: int = 0
    _storages: dict = field(default_factory=dict, repr=False)


def measure_saved(fn: Callable[[], torch.Tensor], exclude: Iterable[torch.Tensor] = ()) -> tuple[object, SavedBytes]:
    """Run ``fn()`` (a forward) under the hooks; return its result and what it saved for backward."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    out = SavedBytes()

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in skip:
            out.saved += t.numel() * t.element_size()
            out.tensors += 1
            if ptr not in out._storages:
                out._storages[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    out.unique = sum(out._storages.values())
    return result, out
