"""A network laid out like torchvision's ResNet (``conv1``, ``bn1``, ``layer1``..., ``fc``), standing in for a
pretrained torchvision or timm backbone in tests (loopwise does not depend on torchvision)."""

from __future__ import annotations

from torch import Tensor, nn


class TinyResNet(nn.Module):
    """conv1-bn1-relu, two stages of conv-bn-relu (``layer1``, ``layer2``), average pooling and ``fc``, with the
    constructor arguments torchvision's ``resnet18(num_classes=...)`` takes, plus ``in_channels``.

    Args:
        num_classes: Outputs of ``fc`` (1,000 for an ImageNet checkpoint).
        in_channels: Channels of the input images.
    """

    def __init__(self, num_classes: int = 1000, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU()
        self.layer1 = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer2(self.layer1(self.relu(self.bn1(self.conv1(x)))))
        return self.fc(self.avgpool(x).flatten(1))
