"""Host-sync frequency (Paddle's ``fetch_frequency``): losses stay on the device and are
fetched to the host every N steps.  Every step's loss is still reported."""
from __future__ import annotations

import torch

__all__ = ["LossFetcher"]


class LossFetcher:
    def __init__(self, every: int = 1):
        if every < 1:
            raise ValueError(f"fetch_frequency={every!r}: must be >= 1")
        self.every = every
        self.pending: list[torch.Tensor] = []
        self.values: list[float] = []
        self.fetches = 0  # host syncs made

    def push(self, loss: torch.Tensor) -> None:
        self.pending.append(loss.detach())
        if len(self.pending) >= self.every:
            self.flush()

    def flush(self) -> list[float]:
        if self.pending:
            self.values.extend(torch.stack(self.pending).float().cpu().tolist())  # one host sync
            self.pending.clear()
            self.fetches += 1
        return self.values
