"""Q-function ensembles: scalar or C51 distributional, with the categorical target projection.

A C51 critic predicts a categorical distribution over ``num_atoms`` fixed returns (the
*support*, evenly spaced in ``[v_min, v_max]``); its Q-value is the distribution's mean. The
Bellman target ``r + discount * Z(s', a')`` lands between atoms and is projected back onto the
support by :func:`project_distribution`. The same :class:`CriticEnsemble` also serves scalar
critics (``num_atoms=0``) for SAC and ensembles of N critics (RLPD/REDQ-style min over a
random subset).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from embodied.policies.mlp import mlp


def make_support(v_min: float, v_max: float, num_atoms: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Evenly spaced atoms ``[num_atoms]`` from ``v_min`` to ``v_max`` inclusive."""
    return torch.linspace(v_min, v_max, num_atoms, device=device)


def project_distribution(
    next_probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """Project ``r + discount * z`` (probabilities ``next_probs``) onto ``support``.

    Args:
        next_probs: ``[B, K]`` probabilities of the successor's return distribution.
        reward: ``[B]`` (n-step) rewards.
        discount: ``[B]`` bootstrap factors (0 after a termination: all mass goes to ``r``).
        support: ``[K]`` evenly spaced atoms.

    Returns:
        ``[B, K]`` probabilities on ``support``: each shifted atom, clipped into
        ``[v_min, v_max]``, splits its mass between its two neighbouring atoms in proportion to
        proximity (all of it to one atom when it lands exactly on it).
    """
    num_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (num_atoms - 1)
    target_z = (reward[:, None] + discount[:, None] * support[None, :]).clamp(v_min, v_max)  # [B, K]
    pos = (target_z - v_min) / delta_z  # fractional atom index in [0, K-1]
    lower = pos.floor().clamp(0, num_atoms - 1)
    upper = pos.ceil().clamp(0, num_atoms - 1)
    # When pos is integral, lower == upper and both weights below are 0: give the mass to lower.
    w_lower = (upper - pos) + (lower == upper).to(pos.dtype)
    w_upper = pos - lower
    out = torch.zeros_like(next_probs)
    out.scatter_add_(1, lower.long(), next_probs * w_lower)
    out.scatter_add_(1, upper.long(), next_probs * w_upper)
    return out


class CriticEnsemble(nn.Module):
    """``num_critics`` independent ``Q(obs, action)`` MLPs, scalar or C51.

    ``num_atoms = 0``: each critic outputs a scalar Q. ``num_atoms > 0``: each outputs logits
    over ``make_support(v_min, v_max, num_atoms)``.
    """

    support: torch.Tensor

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        hidden: Sequence[int],
        num_critics: int = 2,
        num_atoms: int = 0,
        v_min: float = -10.0,
        v_max: float = 10.0,
        layer_norm: bool = False,
        act: str = "relu",
    ) -> None:
        super().__init__()
        if num_critics < 1:
            raise ValueError(f"num_critics must be >= 1, got {num_critics}")
        if num_atoms == 1 or num_atoms < 0:
            raise ValueError(f"num_atoms must be 0 (scalar) or >= 2, got {num_atoms}")
        if num_atoms and not v_min < v_max:
            raise ValueError(f"v_min must be < v_max, got {v_min}, {v_max}")
        self.num_critics = num_critics
        self.num_atoms = num_atoms
        out_dim = num_atoms if num_atoms else 1
        self.nets = nn.ModuleList(
            mlp(obs_dim + action_dim, hidden, out_dim, act=act, layer_norm=layer_norm) for _ in range(num_critics)
        )
        self.register_buffer("support", make_support(v_min, v_max, max(num_atoms, 2)))

    @property
    def distributional(self) -> bool:
        return self.num_atoms > 0

    def forward(self, obs: torch.Tensor, action: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        """Raw outputs ``[E, B, out]`` (logits or scalar Q) of critics ``index`` (default: all).

        ``obs [B, D]`` is already normalized; ``action [B, A]``.
        """
        x = torch.cat([obs, action], dim=-1)
        nets = self.nets if index is None else [self.nets[i] for i in index]
        return torch.stack([net(x) for net in nets])

    def q_from_output(self, out: torch.Tensor) -> torch.Tensor:
        """Q-values ``[E, B]`` from raw outputs ``[E, B, out]`` (mean of the distribution for C51)."""
        if self.distributional:
            return (torch.softmax(out.float(), dim=-1) * self.support).sum(-1)
        return out.squeeze(-1).float()

    def q(self, obs: torch.Tensor, action: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        """Q-values ``[E, B]`` of critics ``index`` (default: all)."""
        return self.q_from_output(self(obs, action, index))

    @torch.no_grad()
    def td_target(
        self, next_out: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, bonus: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Clipped (min over critics) Bellman target from target-critic outputs ``[E, B, out]``.

        ``bonus [B]`` is added to every successor return before discounting (SAC's
        ``-alpha * log pi``). Scalar critics: ``[B]`` = ``r + discount * (min_e Q_e + bonus)``.
        C51: ``[B, K]``, the projected distribution of the critic whose projected mean is the
        smallest, chosen per sample.
        """
        if not self.distributional:
            q_next = next_out.squeeze(-1).float().min(dim=0).values
            if bonus is not None:
                q_next = q_next + bonus
            return reward + discount * q_next
        num_critics, batch, atoms = next_out.shape
        shifted = reward if bonus is None else reward + discount * bonus
        probs = torch.softmax(next_out.float(), dim=-1).reshape(num_critics * batch, atoms)
        projected = project_distribution(
            probs, shifted.repeat(num_critics), discount.repeat(num_critics), self.support
        ).reshape(num_critics, batch, atoms)
        q = (projected * self.support).sum(-1)  # [E, B]
        pick = q.argmin(dim=0)  # [B]
        return projected.gather(0, pick[None, :, None].expand(1, batch, atoms)).squeeze(0)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Summed over critics: cross-entropy to a C51 target ``[B, K]`` or MSE to ``[B]``."""
        if self.distributional:
            log_p = torch.log_softmax(out.float(), dim=-1)
            return -(target * log_p).sum(-1).mean(-1).sum()
        return (out.squeeze(-1).float() - target).square().mean(-1).sum()
