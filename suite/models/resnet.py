"""A small ResNet in which every compute-fusion pattern occurs.

- conv → BatchNorm → ReLU (``fuse_bn_act_ops``), in the stem and every block;
- residual add → ReLU (``fuse_elewise_add_act_ops``), in every basic block;
- ReLU → depthwise conv (``fuse_relu_depthwise_conv``), in every depthwise block.

Activations are modules (not ``F.relu`` calls), so both torch.fx and a module-pattern
rewrite see them.  No dropout: runs are repeatable.
"""
from __future__ import annotations

import torch
from torch import nn

from . import _TOY_SCALE, ModelSpec, _ce, _images

__all__ = ["SmallResNet", "BasicBlock", "DepthwiseBlock", "resnet_spec"]


class Add(nn.Module):
    """Elementwise add as a module, so the add → activation pattern is visible to a module rewrite."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class BasicBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.add = Add()
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(self.add(out, x))


class DepthwiseBlock(nn.Module):
    """1×1 expansion (with bias) → ReLU → depthwise 3×3 → BatchNorm → ReLU → 1×1 projection."""

    def __init__(self, channels: int, expand: int = 2):
        super().__init__()
        hidden = channels * expand
        self.expand = nn.Conv2d(channels, hidden, 1, bias=True)
        self.relu1 = nn.ReLU()
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn = nn.BatchNorm2d(hidden)
        self.relu2 = nn.ReLU()
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dwconv(self.relu1(self.expand(x)))
        return self.project(self.relu2(self.bn(out)))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10, width: int = 16, blocks: int = 2, in_channels: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        layers: list[nn.Module] = []
        for _ in range(blocks):
            layers += [BasicBlock(width), DepthwiseBlock(width)]
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.conv(x)))
        x = self.layers(x)
        return self.fc(self.flatten(self.pool(x)))


def resnet_spec(size: str = "cpu", signal: float = 0.6):
    """The registry's ``resnet`` at ``size``."""
    s = _TOY_SCALE[size]
    return ModelSpec("resnet", lambda: SmallResNet(width=16 * s, blocks=2 * s), _ce, _images(16, signal=signal),
                     "images", size, 16, has_batchnorm=True,
                     description="small ResNet with every compute-fusion pattern (16x16 images)")
