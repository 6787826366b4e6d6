"""A communication-heavy MLP: many parameters, little compute per sample."""
from __future__ import annotations

from torch import nn

__all__ = ["WideMLP"]


class WideMLP(nn.Module):
    def __init__(self, in_features: int, num_classes: int = 10, width: int = 1024, depth: int = 4):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        d = in_features
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU()]
            d = width
        layers.append(nn.Linear(d, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
