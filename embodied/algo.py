"""The algorithm and policy contracts the trainer, exporters and evaluators rely on.

The trainer is never typed to one algorithm: it calls ``act``, steps the env, hands the
transition to ``observe``, and calls ``update`` whenever ``ready_to_update`` says so.
On-policy algorithms become ready when their rollout is full; off-policy ones after warm-up,
then every step (``update`` runs as many gradient steps as the algorithm's config asks).

Offline data and pretrained policies enter through the optional ``preload`` capability
(:class:`Preloadable`): the trainer calls it once, before training or restoring a checkpoint,
when the config names a dataset (``trainer.dataset``) or a base run (``trainer.base_run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from embodied.env import ObsDict
from embodied.errors import EmbodiedError


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


@dataclass(frozen=True)
class PreloadSource:
    """What the config names for an algorithm to start from (at least one is set).

    ``dataset``: a demonstration dataset directory (Minari layout, ``embodied collect``);
    ``base_run``: a run directory whose checkpoint holds a pretrained base policy;
    ``base_policy``: that run's policy, loaded by the trainer (algorithms import no run code).
    """

    dataset: Path | None = None
    base_run: Path | None = None
    base_policy: Policy | None = None

    def describe(self) -> str:
        parts = [
            f"--dataset {self.dataset}" if self.dataset else "",
            f"--base {self.base_run}" if self.base_run else "",
        ]
        return " and ".join(p for p in parts if p)


@runtime_checkable
class Preloadable(Protocol):
    """An algorithm that starts from demonstrations and/or a pretrained base policy."""

    def preload(self, source: PreloadSource) -> None:
        """Load what ``source`` names (raise a named error for what this algorithm cannot use)."""
        ...


class ExportUnsupportedError(EmbodiedError):
    """The policy acts in a way no stateless ``obs -> action`` module carries (e.g. a base that
    runs its action chunks open-loop); its ``export_module()`` raises this, saying why."""


def base_outside_checkpoint(algo: object) -> bool:
    """Whether ``algo`` keeps its frozen base policy out of its checkpoint (``algo.base_outside_checkpoint``),
    so that every rebuild of the run preloads the run's ``trainer.base_run`` again (residual RL)."""
    return bool(getattr(algo, "base_outside_checkpoint", False))


class PreloadUnsupportedError(EmbodiedError):
    """The algorithm has no ``preload``, or cannot use the kind of source the config names."""


def preload_algorithm(algo: object, algo_name: str, source: PreloadSource) -> None:
    """Call ``algo.preload(source)``; a named error when the algorithm does not support it."""
    if not isinstance(algo, Preloadable):
        raise PreloadUnsupportedError(
            f"algorithm {algo_name!r} does not start from a dataset or a base policy, but the config names "
            f"{source.describe()}; use an algorithm with preload (e.g. bc-flow for --dataset, reinflow for --base)"
        )
    algo.preload(source)
