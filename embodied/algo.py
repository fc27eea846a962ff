"""The algorithm and policy contracts the trainer, exporters and evaluators rely on.

The trainer is never typed to one algorithm: it calls ``act``, steps the env, hands the
transition to ``observe``, and calls ``update`` whenever ``ready_to_update`` says so.
On-policy algorithms become ready when their rollout is full; off-policy ones after warm-up,
then every step (``update`` runs as many gradient steps as the algorithm's config asks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from embodied.env import ObsDict


@dataclass
class Transition:
    """One vectorized env step. ``N`` = num_envs.

    ``obs``/``next_obs`` are ObsDicts of ``[N, dim]``; ``next_obs`` is what the env returned
    (already reset where an episode ended); ``final_obs`` is the true successor observation
    (differs from ``next_obs`` only where ``terminated | truncated``).
    """

    obs: ObsDict
    action: torch.Tensor  # [N, A] in [-1, 1]
    reward: torch.Tensor  # [N]
    terminated: torch.Tensor  # [N] bool: true terminal state, no bootstrap
    truncated: torch.Tensor  # [N] bool: time limit, bootstrap from final_obs
    next_obs: ObsDict
    final_obs: ObsDict


@runtime_checkable
class Policy(Protocol):
    """A trained actor. ``obs`` is an ObsDict (group ``"policy"`` used) or a ``[N, D]`` tensor."""

    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[N, A]`` in [-1, 1]."""
        ...

    def export_module(self) -> nn.Module:
        """A pure-tensor, deterministic module ``forward(obs [B, D] float32) -> action [B, A]``.

        Observation normalization is folded in and the output is clipped to [-1, 1]; it holds
        no reference to training state (a deep copy), so exporters may trace it freely.
        """
        ...


@runtime_checkable
class Algorithm(Protocol):
    """What the shared trainer drives."""

    policy: Policy

    def act(self, obs: ObsDict) -> torch.Tensor:
        """Exploration actions ``[N, A]`` in [-1, 1] for the current training step."""
        ...

    def observe(self, transition: Transition) -> None:
        """Store one vectorized step (rollout storage or replay buffer)."""
        ...

    def ready_to_update(self) -> bool: ...

    def update(self) -> dict[str, float]:
        """Run the algorithm's gradient steps; return scalar metrics (losses, lr, KL, ...)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, normalizers, buffers' cursors: enough to resume exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
