"""The vectorized-environment contract every simulator backend and task implements.

Shapes: ``N`` = ``num_envs``; observation groups are dicts of ``[N, dim]`` float32 tensors on
``device``, except the camera group ``"image"`` of a :class:`RenderingEnv`: ``[N, H, W, 3]``
uint8 RGB (channels last, row 0 at the top, as renderers produce it); actions are ``[N, action_dim]`` in [-1, 1]. Environments auto-reset: after a step
in which an env terminated or was truncated, the returned observation is already the first
observation of its next episode, and ``info["final_obs"]`` holds the observation it ended on.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from embodied.config import ConfigError
from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec

ObsDict = dict[str, torch.Tensor]
"""Observation groups: ``"policy"`` always, ``"critic"`` for privileged observations, ``"image"``
for camera images (:class:`RenderingEnv`)."""

IMAGE_GROUP = "image"
"""Observation group of camera images: ``[N, H, W, 3]`` uint8, ``obs_spec`` entry ``(H, W, 3)``."""

IMAGE_SIZE_PX_RANGE = (8, 1024)
"""Allowed width = height of camera images (``env.backend.image_size_px``) on every backend."""


def check_image_size_px(size_px: int) -> None:
    """Raise :class:`~embodied.config.ConfigError` unless ``size_px`` is in :data:`IMAGE_SIZE_PX_RANGE`."""
    low, high = IMAGE_SIZE_PX_RANGE
    if not low <= size_px <= high:
        raise ConfigError(f"image_size_px must be in [{low}, {high}], got {size_px}")


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
    """Observation group name -> per-env shape, e.g. ``{"policy": (30,), "critic": (40,)}``; a
    rendering env adds ``"image": (H, W, 3)`` (uint8, channels last)."""
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


# Optional capabilities. A backend or task that has one of these declares the member; callers
# test with ``isinstance(env, <Capability>)`` (the protocols are runtime-checkable) rather than
# probing attribute names, so a checker sees every use and a rename breaks loudly.


@runtime_checkable
class ResumeReport(Protocol):
    """An env that says whether ``load_state_dict`` restores its simulator state bit-exactly.

    Envs without the attribute resume exactly (the VecEnv contract); a wrapped third-party
    simulator whose state cannot be captured sets ``exact_resume = False`` and the trainer
    starts fresh episodes on resume.
    """

    exact_resume: bool


@runtime_checkable
class ActionSpaceReport(Protocol):
    """An env whose action space may be other than a box in [-1, 1].

    ``action_space_kind`` is ``"box"`` (the VecEnv contract) or ``"discrete"`` (``action_dim``
    = 1, actions are integer indices); envs without the attribute are boxes.
    """

    action_space_kind: str


@runtime_checkable
class PhysicalStateEnv(VecEnv, Protocol):
    """A VecEnv that exposes its raw rigid-body state (software-in-the-loop, sim-robot, play).

    ``physical_state()`` maps names with frames (``pos_w``, ``quat_wb``, ``lin_vel_b``, ...) to
    ``[N, k]`` tensors of the current state, unnormalized.
    """

    def physical_state(self) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class FinalObsReport(Protocol):
    """An env that says whether ``info["final_obs"]`` really is the observation episodes ended on.

    Envs without the attribute provide it exactly (the VecEnv contract). A wrapped simulator
    that resets inside its own step and may not expose the pre-reset observation (Isaac Lab
    without ``compute_final_obs``) sets ``exact_final_obs = False`` once that happened: its
    ``final_obs`` rows of ended envs are then the reset observations.
    """

    exact_final_obs: bool


@runtime_checkable
class TrainingCurriculum(Protocol):
    """An env whose training distribution (or an algorithm whose schedule, e.g. PPO's learning-rate
    cooldown) depends on how far training has come.

    The trainer calls ``set_training_progress(fraction)`` with ``env_steps / total_env_steps``
    (in [0, 1]) on its training env and its algorithm before each rollout; envs built for
    evaluation are never told, so they keep their full (final) distribution.
    """

    def set_training_progress(self, fraction: float) -> None: ...


@runtime_checkable
class RenderingEnv(Protocol):
    """An env that renders camera images (:attr:`embodied.registry.Backend.renders`).

    ``camera`` names the camera that is rendered ("" when images are off for this run). When it
    is set, ``obs_spec`` holds ``"image": (H, W, 3)`` and every observation dict the env returns,
    ``info["final_obs"]`` included, carries ``"image"`` ``[N, H, W, 3]`` uint8 of the state the
    other groups describe. ``render_images()`` renders the current state again without stepping.
    """

    camera: str

    def render_images(self) -> torch.Tensor:
        """``[N, H, W, 3]`` uint8 images of every env's current state."""
        ...


def renders_images(env: object) -> bool:
    """Whether ``env`` puts camera images into its observations (a :class:`RenderingEnv` with a camera)."""
    return isinstance(env, RenderingEnv) and bool(env.camera)


def final_obs_exact(env: object) -> bool:
    """Whether ``env``'s ``info["final_obs"]`` holds the true last observations (:class:`FinalObsReport`)."""
    return not isinstance(env, FinalObsReport) or bool(env.exact_final_obs)


def resumes_exactly(env: object) -> bool:
    """Whether ``env`` restores its simulator state exactly on ``load_state_dict``."""
    return not isinstance(env, ResumeReport) or bool(env.exact_resume)


def action_space_kind(env: object) -> str:
    """``"box"`` unless ``env`` reports another kind (:class:`ActionSpaceReport`)."""
    return str(env.action_space_kind) if isinstance(env, ActionSpaceReport) else "box"


def require_box_actions(env: VecEnv, algo_name: str) -> None:
    """Raise a named error unless ``env`` has continuous actions in [-1, 1] of size >= 1.

    Algorithms whose policy outputs a squashed Gaussian (PPO, SAC, FastTD3) call it at
    construction, so a discrete env fails there instead of deep inside the simulator.
    """
    kind = action_space_kind(env)
    if kind != "box":
        raise EmbodiedError(
            f"{algo_name} needs continuous (box) actions in [-1, 1], but this env's action space is {kind!r}; "
            "use a task with continuous actions (discrete action spaces are not supported by any algorithm yet)"
        )
    if int(env.action_dim) < 1:
        raise EmbodiedError(f"{algo_name} needs an env with action_dim >= 1, got {env.action_dim}")
