"""A small convolutional encoder for camera images, and the exported policy that carries it.

:class:`ImageEncoder` turns uint8 images ``[B, H, W, 3]`` (the ``"image"`` observation group,
channels last) into features ``[B, F]``: pixels scaled to [0, 1] inside, three ReLU convolutions
(16 8x8 stride 4, 32 4x4 stride 2, 32 3x3 stride 1, the Nature-DQN pattern narrowed for CPU
training) and a linear projection with LayerNorm and tanh. At 64x64 the convolutions leave a 32x4x4 map.

:class:`ImageExportedPolicy` is what an image policy's ``export_module()`` returns:
``forward(obs [B, D] float32, image [B, H, W, 3] uint8) -> action [B, A]``, the proprioceptive
normalizer and the encoder folded in. The ONNX exporter traces it with both inputs; the C
exporter refuses it (a convolution is not an MLP layer).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from embodied.normalizer import RunningNormalizer
from embodied.policies.mlp import normalizer_constants

CONV_LAYERS: tuple[tuple[int, int, int], ...] = ((16, 8, 4), (32, 4, 2), (32, 3, 1))
"""``(out_channels, kernel, stride)`` of each convolution."""

PIXEL_SCALE = 1.0 / 255.0
"""What a uint8 pixel is multiplied by before the first convolution (0..255 -> 0..1)."""


def _default_layers(image_shape: tuple[int, int, int], features: int) -> tuple[nn.Sequential, nn.Sequential]:
    """``(convs, project)`` of :data:`CONV_LAYERS` (ReLU each, then a flatten) and a linear
    projection to ``features`` with LayerNorm and tanh, for images of ``image_shape`` (H, W, C)."""
    height, width, channels = image_shape
    layers: list[nn.Module] = []
    prev, h, w = channels, height, width
    for out, kernel, stride in CONV_LAYERS:
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
        if h < 1 or w < 1:
            raise ValueError(f"images of {height}x{width} px are too small for the encoder (>= 36 px needed)")
        layers += [nn.Conv2d(prev, out, kernel, stride), nn.ReLU()]
        prev = out
    layers.append(nn.Flatten())
    # LayerNorm + tanh keep the features on the scale of the normalized proprioceptive vector
    # they are concatenated with, whatever the pixel statistics (as DrQ's encoder does)
    project = nn.Sequential(nn.Linear(prev * h * w, features), nn.LayerNorm(features), nn.Tanh())
    return nn.Sequential(*layers), project


class ImageEncoder(nn.Module):
    """``image [B, H, W, C]`` (uint8 0..255, or float on that scale) -> features ``[B, features]``."""

    def __init__(
        self,
        image_shape: tuple[int, ...],
        features: int = 64,
        layers: tuple[nn.Sequential, nn.Sequential] | None = None,
        pixel_scale: float = PIXEL_SCALE,
    ) -> None:
        """``layers``: ``(convs, project)`` to use instead of the default stack (a policy artifact
        rebuilds its encoder this way); ``convs`` maps ``[B, C, H, W]`` to flat ``[B, K]``,
        ``project`` ``[B, K]`` to ``[B, features]``."""
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(f"image_shape must be (H, W, C), got {image_shape}")
        height, width, channels = (int(v) for v in image_shape)
        self.image_shape = (height, width, channels)
        self.pixel_scale = float(pixel_scale)
        self.convs, self.project = _default_layers(self.image_shape, features) if layers is None else layers
        self.features = int(features)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        # channels last (as rendered) -> channels first (as Conv2d reads), 0..255 -> 0..1
        x = image.permute(0, 3, 1, 2).to(torch.float32) * self.pixel_scale
        out: torch.Tensor = self.project(self.convs(x))
        return out


class ImageExportedPolicy(nn.Module):
    """Deterministic ``(obs [B, D] float32, image [B, H, W, 3] uint8) -> action [B, A]``.

    ``action = clamp(net(cat(clamp((obs - obs_mean) / obs_std, ±obs_clip), encoder(image))), -1, 1)``;
    copies of the trained modules in float32 on the CPU, detached from training.
    """

    obs_mean: torch.Tensor
    obs_std: torch.Tensor

    def __init__(
        self, encoder: ImageEncoder, net: nn.Sequential, obs_mean: torch.Tensor, obs_std: torch.Tensor, obs_clip: float
    ) -> None:
        """``obs_mean``/``obs_std`` ``[D]``: the proprioceptive normalizer; ``net`` reads ``D + F``."""
        super().__init__()
        self.encoder = copy.deepcopy(encoder).float().cpu().eval()
        self.net = copy.deepcopy(net).float().cpu().eval()
        for p in self.parameters():
            p.requires_grad_(False)
        self.register_buffer("obs_mean", obs_mean.detach().float().cpu().clone())
        self.register_buffer("obs_std", obs_std.detach().float().cpu().clone())
        self.obs_clip = float(obs_clip)
        self.image_shape = encoder.image_shape

    @classmethod
    def from_normalizer(
        cls, encoder: ImageEncoder, net: nn.Sequential, normalizer: RunningNormalizer | None, obs_dim: int
    ) -> ImageExportedPolicy:
        """Fold a :class:`RunningNormalizer` (or none: identity) into the exported module."""
        return cls(encoder, net, *normalizer_constants(normalizer, obs_dim))

    def forward(self, obs: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        x = torch.clamp((obs - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        return torch.clamp(self.net(torch.cat([x, self.encoder(image)], dim=-1)), -1.0, 1.0)
