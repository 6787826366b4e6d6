"""The registry models' facts, torch-free: one line per model, the one place they are stated.

A registry model is its module in ``suite/models/`` plus one line of :data:`REGISTRY`: its name, its
factory (``module:function`` of a ``suite.models`` module, imported only when a spec is asked for; the
function takes the size and returns a ``ModelSpec``), its data kind, whether it has BatchNorm, and whether
it is one of the small models (they name their variants, ``suite.cases.Variant.models``) or a published
workload (every variant that applies to its data kind and BatchNorm).  ``suite.models`` builds from these
lines and ``suite.cases`` lists cases from them without importing torch; ``tests/test_models.py`` checks that
every spec agrees with its line.
"""
from __future__ import annotations

from typing import NamedTuple

from .run_spec import SIZES  # the sizes every model is built at (suite.models; `--size`), stated with the run's options

__all__ = ["DATA_KINDS", "SIZES", "RegistryModel", "REGISTRY", "SMALL_MODELS", "PUBLISHED_MODELS", "is_user_ref"]

# What the synthetic data is; it decides which variants apply to a model (suite.cases).
DATA_KINDS = ("images", "tokens", "masked_tokens", "other")


class RegistryModel(NamedTuple):
    name: str
    factory: str  # "module:function" in suite.models
    data: str  # one of DATA_KINDS
    has_batchnorm: bool
    small: bool  # a small model, else a published workload


REGISTRY: tuple[RegistryModel, ...] = (
    RegistryModel("resnet", "resnet:resnet_spec", "images", True, small=True),
    RegistryModel("mlp", "mlp:mlp_spec", "images", False, small=True),
    RegistryModel("transformer", "transformer:transformer_spec", "tokens", False, small=True),
    RegistryModel("resnet50", "resnet50:resnet50_spec", "images", True, small=False),
    RegistryModel("gpt2", "gpt2:gpt2_spec", "tokens", False, small=False),
    RegistryModel("bert", "bert:bert_spec", "masked_tokens", False, small=False),
)
SMALL_MODELS = tuple(m.name for m in REGISTRY if m.small)
# The published workloads: {name: (data kind, has BatchNorm)}.
PUBLISHED_MODELS = {m.name: (m.data, m.has_batchnorm) for m in REGISTRY if not m.small}


def is_user_ref(ref: str) -> bool:
    """Whether ``ref`` names a user's factory (``module:function``), not a registry model or ``hf:Config``."""
    return ":" in ref and not ref.startswith("hf:")
