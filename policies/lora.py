"""Low-rank adapters (LoRA) on the linear layers of a frozen network, and merging them back.

:class:`LoRALinear` is an ``nn.Linear`` whose output gains a trainable low-rank update:
``y = x W^T + b + s (x A^T) B^T`` with ``A [r, in]``, ``B [out, r]`` and ``s = alpha / r``.
``B`` starts at zero, so a freshly adapted network computes exactly what the base computes;
``A`` starts small and random (seeded), so ``B``'s first gradient is not zero. The base weight
and bias stay the very parameters of the wrapped layer (same tensors, same state-dict names),
so code reading ``layer.weight`` keeps working and the frozen weights are not copied.

:func:`merge_lora` folds every adapter into its base weight (``W + s B A``) and puts a plain
``nn.Linear`` back in its place: the result has the original network's structure and state-dict
keys, so whatever loads the original architecture loads it.
"""

from __future__ import annotations

import torch
from torch import nn


class LoRALinear(nn.Linear):
    """``base``'s weight and bias (shared, frozen) plus a rank-``rank`` update scaled by ``alpha / rank``.

    Input ``[..., in_features]`` -> output ``[..., out_features]``.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        nn.Module.__init__(self)  # no fresh weight: the base layer's parameters are reused
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank = int(rank)
        self.scale = float(alpha) / float(rank)
        device = base.weight.device
        # N(0, 1/in) rows: A x has unit-order entries whatever the layer's width
        a = torch.randn(self.rank, self.in_features, generator=generator) / self.in_features**0.5
        self.lora_a = nn.Parameter(a.to(device=device, dtype=torch.float32))
        """``[rank, in_features]``, small random."""
        self.lora_b = nn.Parameter(torch.zeros(self.out_features, self.rank, device=device, dtype=torch.float32))
        """``[out_features, rank]``, zero at the start: the adapted layer starts as the base."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        update = (x.to(self.lora_a.dtype) @ self.lora_a.T) @ self.lora_b.T
        return out + (self.scale * update).to(out.dtype)

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` holding ``W + s B A`` (written into the shared weight) and the bias."""
        plain = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        with torch.no_grad():
            delta = self.scale * (self.lora_b @ self.lora_a)
            self.weight.add_(delta.to(self.weight.dtype))
        plain.weight = self.weight
        plain.bias = self.bias
        return plain

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scale={self.scale:g}"


def add_lora(root: nn.Module, rank: int, alpha: float, seed: int = 0) -> list[LoRALinear]:
    """Replace every ``nn.Linear`` under ``root`` by a :class:`LoRALinear` around it; returns the
    adapters in module order (their ``A`` drawn from one generator seeded with ``seed``)."""
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    generator = torch.Generator().manual_seed(seed)
    adapters: list[LoRALinear] = []
    targets = [
        (parent, name, child)
        for parent in root.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear  # exactly Linear: an adapter is not wrapped again
    ]
    for parent, name, child in targets:
        adapter = LoRALinear(child, rank, alpha, generator)
        setattr(parent, name, adapter)
        adapters.append(adapter)
    return adapters


def merge_lora(root: nn.Module) -> int:
    """Fold every :class:`LoRALinear` under ``root`` into a plain ``nn.Linear`` (in place);
    returns how many were merged."""
    targets = [
        (parent, name, child)
        for parent in root.modules()
        for name, child in parent.named_children()
        if isinstance(child, LoRALinear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, child.merged())
    return len(targets)


def lora_parameter_count(root: nn.Module, rank: int) -> int:
    """Trainable parameters that :func:`add_lora` at ``rank`` gives ``root``: ``rank (in + out)``
    per ``nn.Linear``."""
    return sum(rank * (m.in_features + m.out_features) for m in root.modules() if type(m) is nn.Linear)
