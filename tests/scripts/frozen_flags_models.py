"""A model module that imports the way models taken from torch's test suite do: importing
``torch.testing._internal.common_utils`` calls ``torch.backends.disable_global_flags()`` at import (its line
``torch.backends.disable_global_flags()``), after which assigning ``torch.backends.cudnn.benchmark`` (or
``allow_tf32``, ``deterministic``) raises "not allowed to set torch.backends.cudnn flags after disable_global_flags".
common_utils itself needs ``expecttest``, which the test environment lacks, so the call is made here directly.

``thaw()`` (a rank function) undoes it afterwards, so the session's rank pool goes on as it was.
"""
from __future__ import annotations

import torch

from suite.models import ModelSpec
from tests.scripts.ddp_models import UnusedParamTwoLinLayerNet, _spec

torch.backends.disable_global_flags()


def frozen() -> bool:
    """Whether torch.backends' flags are frozen in this process (the module's import froze them)."""
    try:
        torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark
    except RuntimeError:
        return True
    return False


def thaw() -> bool:
    """A rank function: torch.backends' flags settable again (as before this module's import); True if they were
    frozen."""
    was = frozen()
    vars(torch.backends)["__allow_nonbracketed_mutation_flag"] = True
    return was


class Plain(UnusedParamTwoLinLayerNet):
    def forward(self, x):
        return self.a(x) + self.b(x) + 0 * self.c.weight.sum()  # every parameter used


def make_plain(size: str = "tiny") -> ModelSpec:
    return _spec("frozen_flags", Plain, size=size)
