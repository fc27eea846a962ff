"""Random-shift augmentation of camera images (DrQ's image augmentation for off-policy learners).

Each image of a batch is padded by ``pad_px`` pixels on every side, repeating its edge pixels,
and cropped back to its own size at a random offset: a shift of ``dx, dy`` in
``[-pad_px, pad_px]`` pixels, the uncovered border filled with the edge it came from. Padding
with the edge and cropping equals reading every output pixel from the clamped source position,
so the shift is a single gather on the uint8 images (no float copy, no padded buffer).

Shapes: ``B`` = batch, ``H``/``W`` = image height/width in pixels, ``C`` = channels.
"""

from __future__ import annotations

import torch


def random_shift(images: torch.Tensor, pad_px: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``images [B, H, W, C]`` (any dtype) shifted by a random whole-pixel offset per image,
    at most ``pad_px`` along each axis, with replicated edges; ``pad_px = 0`` returns ``images``."""
    if pad_px < 0:
        raise ValueError(f"pad_px must be >= 0, got {pad_px}")
    if pad_px == 0:
        return images
    size, height, width = images.shape[0], images.shape[1], images.shape[2]
    device = images.device
    shift = torch.randint(-pad_px, pad_px + 1, (size, 2), device=device, generator=generator)  # [B, (dy, dx)]
    rows = (torch.arange(height, device=device) + shift[:, :1]).clamp(0, height - 1)  # [B, H]
    cols = (torch.arange(width, device=device) + shift[:, 1:]).clamp(0, width - 1)  # [B, W]
    batch = torch.arange(size, device=device)[:, None, None]
    return images[batch, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
