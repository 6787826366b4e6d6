"""ResNet-50 with torchvision's layout: the same module tree, parameter names and shapes.

The model is written here (torchvision is optional: its PyPI wheel does not import against
this CPU torch), but ``ResNet50().state_dict()`` loads into ``torchvision.models.resnet50()``
and back: ``conv1``/``bn1`` stem, ``layer1``..``layer4`` of 3-4-6-3 bottleneck blocks
(``conv1``/``bn1`` 1×1, ``conv2``/``bn2`` 3×3 carrying the stride, "ResNet v1.5",
``conv3``/``bn3`` 1×1 expanding by 4, ``downsample.0``/``downsample.1`` on the first block
of each stage), ``fc``.  161 parameter tensors, 25,557,032 parameters at 1000 classes.

The forward is torchvision's too: one ``nn.ReLU(inplace=True)`` per block, called three
times, and ``out += identity`` before the last call, so the compute-fusion pass sees the
graph a torchvision user would give it (BatchNorm → ReLU twice per block plus the stem,
add → ReLU once per block).  Initialisation follows torchvision: Kaiming-normal
(``fan_out``) convolutions, BatchNorm weight 1 and bias 0, PyTorch's default Linear.

``width`` scales every stage (64 is ResNet-50; the ``tiny`` size uses 8): the module tree and
parameter count per tensor kind stay the same, only channel counts shrink.
"""
from __future__ import annotations

import json
import os
from typing import NamedTuple

import torch
from torch import nn

from . import ModelSpec, _ce, _images

__all__ = ["ResNet50", "Bottleneck", "LAYOUT_PATH", "load_layout", "layout_of"]

LAYOUT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layouts", "resnet50.json")
STAGES = (3, 4, 6, 3)


class Bottleneck(nn.Module):
    """1×1 reduce → 3×3 (stride here) → 1×1 expand (×4), each followed by BatchNorm; residual add; ReLU."""

    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        out_channels = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_channels, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet50(nn.Module):
    layer1: nn.Sequential  # added by name in __init__ (torchvision's names)
    layer2: nn.Sequential
    layer3: nn.Sequential
    layer4: nn.Sequential

    def __init__(self, num_classes: int = 1000, width: int = 64, in_channels: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        channels = width
        for i, blocks in enumerate(STAGES):
            planes = width * 2**i
            stage, channels = self._stage(channels, planes, blocks, stride=1 if i == 0 else 2)
            self.add_module(f"layer{i + 1}", stage)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    @staticmethod
    def _stage(in_channels: int, planes: int, blocks: int, stride: int) -> tuple[nn.Sequential, int]:
        out_channels = planes * Bottleneck.expansion
        downsample = None
        if stride != 1 or in_channels != out_channels:
            downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        layers = [Bottleneck(in_channels, planes, stride, downsample)]
        layers += [Bottleneck(out_channels, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers), out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def layout_of(module: nn.Module) -> list[list]:
    """``[[name, [shape...]], ...]`` of the trainable parameters, in registration order."""
    return [[name, list(p.shape)] for name, p in module.named_parameters() if p.requires_grad]


def load_layout(path: str = LAYOUT_PATH) -> list[list]:
    """The checked-in table of torchvision ``resnet50()``'s parameter names and shapes (1000 classes)."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)["parameters"]


# ---- the workload at each size ------------------------------------------------------------------
# full: PyTorch's DDP benchmark (ResNet-50, 224 px, batch 32 per rank, ImageNet's 1000 classes).
# cpu:  the same module and parameters (161 tensors, 25,557,032 elements, 97.5 MiB of fp32
#       gradients), so buckets and communication are those of the real model; only the images
#       and the batch shrink (see resnet50_spec for the step time measured).
# tiny: for tests: the same module tree and 161 tensors (3-4-6-3 bottlenecks), channels / 8,
#       10 classes, 32 px.
class ResNet50Size(NamedTuple):
    """What a size sets: input resolution, batch per rank, classes, base width, the synthetic set."""

    image_size: int
    per_rank_batch: int
    classes: int
    width: int
    dataset_size: int


SIZES: dict[str, ResNet50Size] = {
    "full": ResNet50Size(image_size=224, per_rank_batch=32, classes=1000, width=64, dataset_size=512),
    "cpu": ResNet50Size(image_size=64, per_rank_batch=8, classes=1000, width=64, dataset_size=256),
    "tiny": ResNet50Size(image_size=32, per_rank_batch=4, classes=10, width=8, dataset_size=256),
}


def resnet50_spec(size: str = "cpu", signal: float = 0.6):
    """ResNet-50 at ``size`` (see :data:`SIZES`); ``has_batchnorm`` is set.

    ``cpu``: 64 px images, batch 8 per rank.  Measured once on the 2-core CI-sized machine
    (shared with other jobs, load average ~4), plain data parallel (161 allreduces of 97.5 MiB
    in all over gloo), world 2, one thread per rank, SGD: median 0.92 s per step (0.85-0.96 s
    over 4 steps; peak 0.63 GB per rank).  96 px with the same batch took 1.2-2.0 s, so 64 px
    is the largest round size inside the 0.5-1.5 s target.
    """
    s = SIZES[size]
    classes, width = s.classes, s.width
    return ModelSpec(
        "resnet50", lambda: ResNet50(num_classes=classes, width=width), _ce,
        _images(s.image_size, classes=classes, signal=signal), "images", size, s.per_rank_batch,
        dataset_size=s.dataset_size, has_batchnorm=True,
        description=(f"ResNet-50 (torchvision layout, 3-4-6-3 bottlenecks, width {width}, {classes} classes, "
                     f"{s.image_size} px)"),
    )
