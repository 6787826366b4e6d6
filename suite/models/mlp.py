"""A communication-heavy MLP: many parameters, little compute per sample."""
from __future__ import annotations

from torch import nn

from . import _TOY_SCALE, ModelSpec, _ce, _images

__all__ = ["WideMLP", "mlp_spec"]


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


def mlp_spec(size: str = "cpu", signal: float = 0.6):
    """The registry's ``mlp`` at ``size``."""
    s = _TOY_SCALE[size]
    return ModelSpec("mlp", lambda: WideMLP(3 * 16 * 16, width=1024 * s, depth=4), _ce, _images(16, signal=signal),
                     "images", size, 16, description="4-layer MLP, 1024 wide (16x16 images)")
