"""LoRA adapters (:mod:`embodied.policies.lora`) on a small torch network: the adapted network
starts as the base, only the adapters get gradients, their count is what the rank predicts,
and merging gives a plain network with the base's state-dict keys and the adapted outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from embodied.policies.lora import LoRALinear, add_lora, lora_parameter_count, merge_lora


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Sequential(nn.Linear(16, 12, bias=False), nn.ReLU()))


def test_adapters_start_as_the_base_and_only_they_train() -> None:
    net = network()
    x = torch.randn(5, 6)
    want = net(x).detach()
    keys = set(net.state_dict())
    predicted = lora_parameter_count(net, 4)
    net.requires_grad_(False)
    adapters = add_lora(net, rank=4, alpha=8.0)
    assert len(adapters) == 2 and all(isinstance(a, LoRALinear) for a in adapters)
    assert predicted == 4 * (6 + 16) + 4 * (16 + 12)
    trainable = [p for p in net.parameters() if p.requires_grad]
    assert sum(p.numel() for p in trainable) == predicted
    assert keys < set(net.state_dict())  # the base weights keep their names; adapters are added
    torch.testing.assert_close(net(x), want, rtol=0, atol=0)  # B = 0: exactly the base
    net(x).square().sum().backward()
    assert all(a.lora_b.grad is not None and a.lora_b.grad.abs().sum() > 0 for a in adapters)
    assert all(p.grad is None for p in net.parameters() if not p.requires_grad)


def test_merge_gives_a_plain_network_with_the_adapted_outputs() -> None:
    net = network()
    keys = set(net.state_dict())
    net.requires_grad_(False)
    adapters = add_lora(net, rank=3, alpha=6.0, seed=1)
    with torch.no_grad():
        for a in adapters:
            a.lora_b.normal_()  # as after training: the update is not zero
    x = torch.randn(7, 6)
    adapted = net(x).detach()
    base = network()(x).detach()
    assert (adapted - base).abs().max() > 1e-2
    assert merge_lora(net) == 2
    assert not any(isinstance(m, LoRALinear) for m in net.modules())
    assert set(net.state_dict()) == keys
    assert float((net(x) - adapted).abs().max()) <= 1e-5
    assert merge_lora(net) == 0


def test_same_seed_same_adapters_and_rank_is_checked() -> None:
    a = add_lora(network(), rank=2, alpha=2.0, seed=3)
    b = add_lora(network(), rank=2, alpha=2.0, seed=3)
    torch.testing.assert_close(a[1].lora_a, b[1].lora_a, rtol=0, atol=0)
    with pytest.raises(ValueError, match="rank"):
        add_lora(network(), rank=0, alpha=1.0)


def test_vla_lora_settings_are_validated() -> None:
    from embodied.algos.reinflow import VLAFineTuneCfg
    from embodied.config import ConfigError, apply_overrides

    cfg = apply_overrides(VLAFineTuneCfg(), {"train": "lora", "lora_rank": 4, "lora_alpha": 8}, "cli")
    assert (cfg.train, cfg.lora_rank, cfg.lora_alpha) == ("lora", 4, 8.0)
    with pytest.raises(ConfigError, match=r"algo\.vla\.lora_rank must be >= 1, got 0"):
        VLAFineTuneCfg(train="lora", lora_rank=0)
    with pytest.raises(ConfigError, match=r"algo\.vla\.lora_alpha must be a number > 0"):
        VLAFineTuneCfg(train="lora", lora_alpha=-1.0)
    with pytest.raises(ConfigError, match=r"key 'train' must be one of 'expert', 'last_layers', 'lora'"):
        apply_overrides(VLAFineTuneCfg(), {"train": "adapters"}, "cli")
