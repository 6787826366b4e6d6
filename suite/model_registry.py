"""The registry models' facts, torch-free: one line per model, the one place they are stated.

A registry model is its module in ``suite/models/`` plus one line of :data:`REGISTRY`: its name, its
factory (``module:function`` of a ``suite.models`` module, imported only when a spec is asked for; the
function takes the size and returns a ``ModelSpec``), its data kind, whether it has BatchNorm, and whether
it is one of the small models (they name their variants, ``suite.cases.Variant.models``) or a published
workload (every variant that applies to its data kind and BatchNorm), and its rough seconds per training step
on one rank at each device's default size (a guess that sizes a first nightly plan before anything was measured on
the machine, ``suite/nightly.py``; orders of magnitude from this project's CPU runs and published GPU throughputs).
``suite.models`` builds from these lines and ``suite.cases`` lists cases from them without importing torch;
``tests/test_models.py`` checks that every spec agrees with its line.
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
    rough_step_s: tuple[float, float]  # rough seconds per step, one rank: (cpu at size cpu, cuda at size full)


REGISTRY: tuple[RegistryModel, ...] = (
    RegistryModel("resnet", "resnet:resnet_spec", "images", True, small=True, rough_step_s=(0.05, 0.005)),
    RegistryModel("mlp", "mlp:mlp_spec", "images", False, small=True, rough_step_s=(0.01, 0.002)),
    RegistryModel("transformer", "transformer:transformer_spec", "tokens", False, small=True,
                  rough_step_s=(0.05, 0.005)),
    RegistryModel("resnet50", "resnet50:resnet50_spec", "images", True, small=False, rough_step_s=(2.5, 0.15)),
    RegistryModel("gpt2", "gpt2:gpt2_spec", "tokens", False, small=False, rough_step_s=(2.0, 0.35)),
    RegistryModel("bert", "bert:bert_spec", "masked_tokens", False, small=False, rough_step_s=(1.5, 0.25)),
)
SMALL_MODELS = tuple(m.name for m in REGISTRY if m.small)
# The published workloads: {name: (data kind, has BatchNorm)}.
PUBLISHED_MODELS = {m.name: (m.data, m.has_batchnorm) for m in REGISTRY if not m.small}


def is_user_ref(ref: str) -> bool:
    """Whether ``ref`` names a user's factory (``module:function``), not a registry model or ``hf:Config``."""
    return ":" in ref and not ref.startswith("hf:")
