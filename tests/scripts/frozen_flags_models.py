"""A model module that imports the way models taken from torch's test suite do: importing
``torch.testing._internal.common_utils`` calls ``torch.backends.disable_global_flags()`` at import (its line
``torch.backends.disable_global_flags()``), after which assigning ``torch.backends.cudnn.benchmark`` (or
``allow_tf32``, ``deterministic``) raises "not allowed to set torch.backends.cudnn flags after disable_global_flags".
common_utils itself needs ``expecttest``, which the test environment lacks, so the call is made here directly.

tests/test_ddp_verdicts.py's ``thaw_on_rank`` undoes it afterwards, so the session's rank pool goes on as it was.
"""
from __future__ import annotations

import torch

from suite.models import ModelSpec
from tests.scripts.ddp_models import UnusedParamTwoLinLayerNet, _spec

torch.backends.disable_global_flags()


class Plain(UnusedParamTwoLinLayerNet):
    def forward(self, x):
        return self.a(x) + self.b(x) + 0 * self.c.weight.sum()  # every parameter used


def make_plain(size: str = "tiny") -> ModelSpec:
    return _spec("frozen_flags", Plain, size=size)
