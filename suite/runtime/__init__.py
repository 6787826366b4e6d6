"""Rank launch, communicator groups and the long-lived rank pool."""
from .context import RankContext, current
from .device import CudaUnavailable, Platform, require_cuda, select_platform
from .pool import RankError, RankFailure, RankPool

__all__ = ["RankContext", "current", "CudaUnavailable", "Platform", "require_cuda", "select_platform",
           "RankPool", "RankFailure", "RankError"]
