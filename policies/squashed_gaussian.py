"""Tanh-squashed Gaussian actor (SAC) with running observation normalization.

``u ~ N(mean(s), std(s)^2)``, ``a = tanh(u)``; ``log pi(a|s) = log N(u) - sum log(1 - tanh(u)^2)``.
The log standard deviation is squashed smoothly into ``[log_std_min, log_std_max]``.
Shapes: ``B`` = batch, ``D`` = policy observation size, ``A`` = action size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from embodied.env import ObsDict
from embodied.normalizer import RunningNormalizer
from embodied.policies.deterministic import init_output_layer, policy_obs
from embodied.policies.mlp import ExportedPolicy, Tanh, activation, mlp

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


class SquashedGaussianActor(nn.Module):
    """Trunk MLP with a mean head and a log-std head; actions are ``tanh`` of a Gaussian sample."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: Sequence[int] = (256, 256),
        activation_name: str = "relu",
        log_std_min: float = -5.0,
        log_std_max: float = 2.0,
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
        init_action_mean: Sequence[float] | None = None,
        mean_init_std: float | None = None,
    ) -> None:
        """``mean_init_std``: if set, the mean head starts with weights ~ N(0, it) (see
        :func:`init_output_layer`); ``init_action_mean`` then sets the initial squashed mean."""
        super().__init__()
        if not log_std_min < log_std_max:
            raise ValueError(f"log_std_min must be < log_std_max, got {log_std_min}, {log_std_max}")
        self.obs_dim = obs_dim
        self.action_dim = action_dim
        self.log_std_min = log_std_min
        self.log_std_max = log_std_max
        if not hidden:
            raise ValueError("the SAC actor needs at least one hidden layer")
        # The trunk ends with an activation so both heads are plain Linear layers: the export
        # is then trunk + mean head + Tanh, an nn.Sequential every exporter can walk.
        trunk = mlp(obs_dim, hidden[:-1], hidden[-1], act=activation_name)
        self.trunk = nn.Sequential(*trunk, activation(activation_name))
        self.mean_head = nn.Linear(hidden[-1], action_dim)
        self.log_std_head = nn.Linear(hidden[-1], action_dim)
        if mean_init_std is not None or init_action_mean is not None:
            init_output_layer(self.mean_head, mean_init_std or 0.01, init_action_mean, squash=True)
        self.obs_norm = RunningNormalizer(obs_dim, clip=obs_clip) if normalize_obs else None

    def normalize(self, obs_raw: torch.Tensor) -> torch.Tensor:
        """Raw ``[B, D]`` -> normalized ``[B, D]`` (identity without normalization)."""
        return obs_raw if self.obs_norm is None else self.obs_norm(obs_raw)

    def distribution(self, obs_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mean [B, A], log_std [B, A])`` of the pre-squash Gaussian."""
        h = self.trunk(obs_norm)
        raw = torch.tanh(self.log_std_head(h))
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (raw + 1.0)
        return self.mean_head(h), log_std

    def sample(self, obs_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterized ``(action [B, A] in (-1, 1), log_prob [B])`` from normalized obs."""
        mean, log_std = self.distribution(obs_norm)
        eps = torch.randn_like(mean)
        u = mean + eps * log_std.exp()
        gauss_logp = -(0.5 * eps.square() + log_std + _HALF_LOG_2PI).sum(-1)
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|.
        log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        return torch.tanh(u), gauss_logp - log_det.sum(-1)

    @torch.no_grad()
    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[B, A]`` in [-1, 1]: ``tanh(mean)`` when deterministic, else a sample."""
        obs_norm = self.normalize(policy_obs(obs))
        if deterministic:
            return torch.tanh(self.mean_head(self.trunk(obs_norm)))
        return self.sample(obs_norm)[0]

    def deterministic_net(self) -> nn.Sequential:
        """``normalized obs [B, D] -> tanh(mean) [B, A]``: the deterministic action as one Sequential
        (sharing this actor's layers) that exporters can walk."""
        return nn.Sequential(*self.trunk, self.mean_head, Tanh())

    def export_module(self) -> ExportedPolicy:
        """``obs [B, D] -> tanh(mean(norm(obs))) [B, A]`` with the normalizer folded in."""
        return ExportedPolicy.from_normalizer(self.deterministic_net(), self.obs_norm, self.obs_dim)
