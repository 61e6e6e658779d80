"""Small CNNs for 28-64 px MedMNIST images (the foundation's default model)."""

from __future__ import annotations

from torch import nn

from fedmedbench.models.registry import register_model


class SmallCNN(nn.Module):
    """Two conv blocks (conv-BN-ReLU-pool) and a two-layer classifier.

    ``features`` and ``classifier`` are separate attributes so personalised methods
    can name them (e.g. keep the classifier local).
    """

    def __init__(self, in_channels: int, num_classes: int, image_size: int, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d(4), nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Linear(2 * width * 16, 128), nn.ReLU(inplace=True), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


@register_model("cnn_small")
def cnn_small(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return SmallCNN(in_channels, num_classes, image_size, width=16)


@register_model("cnn")
def cnn(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return SmallCNN(in_channels, num_classes, image_size, width=32)
