"""Small ResNet-style convolutional image classifier."""

from __future__ import annotations

from torch import Tensor, nn


def conv3x3(in_channels: int, out_channels: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution with padding 1 and no bias (a BatchNorm follows it)."""
    return nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN plus a shortcut, then ReLU.

    The shortcut is the identity, or a 1x1 conv + BN projection when the stride or the channel count changes.

    Args:
        in_channels: Channels of the block's input.
        out_channels: Channels of the block's output.
        stride: Stride of the first convolution (2 halves the height and width).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, in_channels, H, W)`` to ``(batch, out_channels, ceil(H / stride), ceil(W / stride))``."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ConvNet(nn.Module):
    """A small ResNet for images: stem, residual stages, global average pooling, dropout and a Linear head.

    The stem is conv3x3-BN-ReLU at ``widths[0]`` channels (stride 1, so small images such as 8x8 digits keep
    their resolution). Stage ``i`` has ``blocks_per_stage`` residual basic blocks of ``widths[i]`` channels; every
    stage after the first halves the height and width with a stride-2 first block (8x8 inputs with three stages
    end at 2x2, 32x32 at 8x8). Works with any input size (8x8 and up is sensible) and with channels-last inputs.

    Args:
        in_channels: Channels of the input images: 1 (grayscale) or 3 (RGB).
        num_classes: Number of output logits: number of classes, 1 for binary.
        widths: Channels of each stage, in order; one stage per entry.
        blocks_per_stage: Residual blocks in each stage.
        dropout: Dropout probability before the Linear head (0 disables it).
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        widths: list[int] = [32, 64, 128],  # noqa: B006 - read-only default, shown in --help
        blocks_per_stage: int = 1,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if in_channels < 1:
            raise ValueError(f"ConvNet: in_channels must be >= 1, got {in_channels}")
        if num_classes < 1:
            raise ValueError(f"ConvNet: num_classes must be >= 1, got {num_classes}")
        if len(widths) == 0:
            raise ValueError(f"ConvNet: widths needs at least one stage width, got {list(widths)}")
        if any(w < 1 for w in widths):
            raise ValueError(f"ConvNet: every width must be >= 1, got {list(widths)}")
        if blocks_per_stage < 1:
            raise ValueError(f"ConvNet: blocks_per_stage must be >= 1, got {blocks_per_stage}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"ConvNet: dropout must be in [0, 1), got {dropout}")
        self.in_channels = in_channels
        self.num_classes = num_classes
        self.widths = list(widths)
        self.stem = nn.Sequential(conv3x3(in_channels, widths[0]), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        stages: list[nn.Module] = []
        channels = widths[0]
        for i, width in enumerate(widths):
            blocks: list[nn.Module] = []
            for j in range(blocks_per_stage):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(channels, width, stride))
                channels = width
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.head = nn.Linear(channels, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-normal (fan_out, ReLU) convolutions; BatchNorm scale 1 and shift 0; default Linear head."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> Tensor:
        """Map images ``(batch, in_channels, H, W)`` (contiguous or channels-last) to ``(batch, num_classes)``."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(
                f"ConvNet(in_channels={self.in_channels}) expects input of shape (batch, {self.in_channels}, H, W), "
                f"got {tuple(x.shape)}"
            )
        x = self.stages(self.stem(x))
        x = self.pool(x).flatten(1)
        return self.head(self.dropout(x))
