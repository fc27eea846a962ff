"""The vectorized-environment contract every simulator backend and task implements.

Shapes: ``N`` = ``num_envs``; observation groups are dicts of ``[N, dim]`` float32 tensors on
``device``; actions are ``[N, action_dim]`` in [-1, 1]. Environments auto-reset: after a step
in which an env terminated or was truncated, the returned observation is already the first
observation of its next episode, and ``info["final_obs"]`` holds the observation it ended on.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from embodied.io_spec import IOSpec

ObsDict = dict[str, torch.Tensor]
"""Observation groups: ``"policy"`` always, ``"critic"`` for privileged observations."""

StepResult = tuple[ObsDict, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]
"""``(obs, reward [N], terminated [N] bool, truncated [N] bool, info)``."""


@runtime_checkable
class VecEnv(Protocol):
    """A batch of ``num_envs`` environments stepped together as tensors.

    ``info`` keys every env provides:
      - ``"final_obs"``: ObsDict, the observation each env was in when its episode ended
        (rows of envs that did not end equal the returned obs). Off-policy targets
        bootstrap from it on time-outs.
      - ``"reward_terms"``: dict[str, Tensor [N]] of the weighted reward terms summed in
        ``reward``, for logging.
      - ``"success"``: bool Tensor [N]; meaningful only where ``terminated | truncated``.
    """

    num_envs: int
    device: torch.device
    obs_spec: dict[str, tuple[int, ...]]
    """Observation group name -> per-env shape, e.g. ``{"policy": (30,), "critic": (40,)}``."""
    action_dim: int
    dt: float
    """Control period in seconds (one ``step``)."""
    max_episode_steps: int

    def reset(self, seed: int | None = None) -> ObsDict:
        """Reset every env; ``seed`` reseeds the env's random generator."""
        ...

    def step(self, action: torch.Tensor) -> StepResult:
        """Advance one control period with ``action`` [N, action_dim] in [-1, 1]."""
        ...

    def io_spec(self) -> IOSpec:
        """Names, sizes, units and frames of the policy observation and action fields."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-exactly (physics state, RNG, counters)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...
