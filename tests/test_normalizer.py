"""Running observation normalization and its folding into exported policies."""

from __future__ import annotations

import torch
from export_support import linear_layer

from embodied.normalizer import RunningNormalizer
from embodied.policies.mlp import ExportedPolicy, mlp


def test_batched_updates_match_whole_data_statistics() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1000, 4, generator=gen) * torch.tensor([1.0, 5.0, 0.1, 20.0]) + 3.0
    norm = RunningNormalizer(4)
    for chunk in x.split(137):
        norm.update(chunk)
    torch.testing.assert_close(norm.mean, x.double().mean(0))
    torch.testing.assert_close(norm.var, x.double().var(0, unbiased=False))
    assert norm.count.item() == 1000
    z = norm(x)
    torch.testing.assert_close(z.mean(0), torch.zeros(4), atol=1e-5, rtol=0)
    torch.testing.assert_close(z.std(0, unbiased=False), torch.ones(4), atol=1e-4, rtol=0)


def test_exported_policy_folds_normalizer_and_clips() -> None:
    norm = RunningNormalizer(3, clip=2.0)
    norm.update(torch.randn(500, 3) * 4.0 + 1.0)
    net = mlp(3, (8,), 2, act="tanh")
    exported = ExportedPolicy.from_normalizer(net, norm, 3)
    obs = torch.randn(64, 3) * 10.0
    expected = torch.clamp(net(norm(obs)), -1.0, 1.0)
    torch.testing.assert_close(exported(obs), expected)
    with torch.no_grad():
        linear_layer(net, 0).weight.mul_(100.0)  # the export is a copy: later training does not leak into it
    torch.testing.assert_close(exported(obs), expected)
    assert exported(obs * 1e6).abs().max() <= 1.0
