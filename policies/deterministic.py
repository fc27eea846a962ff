"""Deterministic tanh MLP actor (TD3 / FastTD3) with running observation normalization.

Shapes: ``B`` = batch, ``D`` = policy observation size, ``A`` = action size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from embodied.env import ObsDict
from embodied.normalizer import RunningNormalizer
from embodied.policies.mlp import ExportedPolicy, mlp


def policy_obs(obs: ObsDict | torch.Tensor) -> torch.Tensor:
    """The actor's raw observation ``[B, D]`` from an ObsDict (group ``policy``) or a tensor."""
    return obs if isinstance(obs, torch.Tensor) else obs["policy"]


def init_output_layer(layer: nn.Linear, weight_std: float, action_mean: Sequence[float] | None, squash: bool) -> None:
    """Small random output weights so the initial action barely depends on the state.

    ``action_mean [A]`` sets the initial action through the bias (``atanh`` of it when the
    output is tanh-squashed); without it the bias is zero.
    """
    with torch.no_grad():
        nn.init.normal_(layer.weight, 0.0, weight_std)
        if action_mean is None:
            nn.init.zeros_(layer.bias)
            return
        if len(action_mean) != layer.out_features:
            raise ValueError(f"init_action_mean has {len(action_mean)} values, the action has {layer.out_features}")
        mean = torch.as_tensor(action_mean, dtype=layer.bias.dtype)
        layer.bias.copy_(torch.atanh(mean.clamp(-0.999, 0.999)) if squash else mean)


class DeterministicActor(nn.Module):
    """``a = tanh(net(norm(obs)))``; exploration noise is added by the algorithm.

    The last linear layer starts with weights ~ N(0, ``out_init_std``) (0.01 in FastTD3), so
    the initial policy outputs ``init_action_mean`` (or 0) almost independently of the state.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation: str = "relu",
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
        out_init_std: float = 0.01,
        init_action_mean: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.net = mlp(obs_dim, hidden, action_dim, act=activation, out_act="tanh")
        self.obs_norm = RunningNormalizer(obs_dim, clip=obs_clip) if normalize_obs else None
        out_layer = self.net[-2]
        assert isinstance(out_layer, nn.Linear)
        init_output_layer(out_layer, out_init_std, init_action_mean, squash=True)

    def normalize(self, obs_raw: torch.Tensor) -> torch.Tensor:
        """Raw ``[B, D]`` -> normalized ``[B, D]`` (identity without normalization)."""
        return obs_raw if self.obs_norm is None else self.obs_norm(obs_raw)

    def forward(self, obs_norm: torch.Tensor) -> torch.Tensor:
        """Actions ``[B, A]`` in (-1, 1) from normalized observations ``[B, D]``."""
        return self.net(obs_norm)

    @torch.no_grad()
    def act(
        self, obs: ObsDict | torch.Tensor, deterministic: bool = False, noise_std: torch.Tensor | float = 0.1
    ) -> torch.Tensor:
        """Actions ``[B, A]`` in [-1, 1]; unless deterministic, plus N(0, noise_std²) noise.

        ``noise_std`` is a float or a ``[B, 1]`` tensor (per-env exploration scale).
        """
        action = self.net(self.normalize(policy_obs(obs)))
        if deterministic:
            return action
        return (action + torch.randn_like(action) * noise_std).clamp(-1.0, 1.0)

    def deterministic_net(self) -> nn.Sequential:
        """``normalized obs [B, D] -> tanh(net) [B, A]`` (this actor's own layers)."""
        return self.net

    def export_module(self) -> ExportedPolicy:
        """``obs [B, D] -> tanh(net(norm(obs))) [B, A]`` with the normalizer folded in."""
        return ExportedPolicy.from_normalizer(self.deterministic_net(), self.obs_norm, self.obs_dim)
