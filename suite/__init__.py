"""fleetbench: Paddle Fleet's data-parallel training strategies, implemented on PyTorch,
benchmarked and checked against single-process references.

Public API::

    from suite import StrategyConfig, build_engine
"""
from .config import ConfigError, StrategyConfig

__all__ = ["StrategyConfig", "ConfigError", "build_engine", "Engine"]
__version__ = "0.1.0"


def __getattr__(name):  # torch is imported lazily: `fleetbench --help` and config errors stay fast
    if name in ("build_engine", "Engine"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
