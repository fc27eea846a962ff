"""Running mean/variance observation normalization, shared by every algorithm.

Statistics are float64 buffers so long runs do not lose precision; ``forward`` returns
float32. The module is an ``nn.Module`` so it folds into exported policies unchanged.

In multi-process training (:mod:`embodied.distributed`) every ``update`` merges the batches of
all ranks (an all-reduce of their counts, sums and sums of squares), so every rank keeps the
statistics one process would have over the union of the data.
"""

from __future__ import annotations

import torch
from torch import nn

from embodied import distributed


class RunningNormalizer(nn.Module):
    """Normalizes ``x [B, D]`` to roughly zero mean and unit variance, clipped to ``±clip``.

    Update with :meth:`update` (parallel Welford/Chan merge of a batch); freeze by not calling it.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.dim = dim
        self.clip = clip
        self.eps = eps
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge the statistics of a batch ``x [B, D]`` (of every rank's batch in a world)."""
        x = x.reshape(-1, self.dim).to(torch.float64)
        if distributed.current() is not None:
            self._update_across_ranks(x)
            return
        batch_count = x.shape[0]
        if batch_count == 0:
            return
        batch_mean = x.mean(dim=0)
        # E[x²] − E[x]² in float64: as exact as torch.var here, and much cheaper on CPU.
        batch_var = (x.square().mean(dim=0) - batch_mean.square()).clamp_min(0.0)
        self._merge(batch_count, batch_mean, batch_var)

    def _update_across_ranks(self, x: torch.Tensor) -> None:
        """One all-reduce of ``[count, sum x [D], sum x² [D]]``: the union batch's moments."""
        moments = torch.cat([x.new_full((1,), float(x.shape[0])), x.sum(dim=0), x.square().sum(dim=0)])
        distributed.sum_(moments)
        # The count stays a tensor (no host sync per step); every rank steps at least one env,
        # so the union batch is never empty.
        batch_count = moments[0]
        batch_mean = moments[1 : 1 + self.dim] / batch_count
        batch_var = (moments[1 + self.dim :] / batch_count - batch_mean.square()).clamp_min(0.0)
        self._merge(batch_count, batch_mean, batch_var)

    def _merge(self, batch_count: float | torch.Tensor, batch_mean: torch.Tensor, batch_var: torch.Tensor) -> None:
        """Chan's parallel merge of a batch's count, mean ``[D]`` and variance ``[D]``."""
        total = self.count + batch_count
        delta = batch_mean - self.mean
        new_mean = self.mean + delta * (batch_count / total)
        m2 = self.var * self.count + batch_var * batch_count + delta.square() * self.count * batch_count / total
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, D]`` -> normalized float32 ``[B, D]``."""
        mean = self.mean.to(x.dtype)
        std = torch.sqrt(self.var + self.eps).to(x.dtype)
        return torch.clamp((x - mean) / std, -self.clip, self.clip)
