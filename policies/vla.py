"""What a vision-language-action policy needs here, and an adapter for LeRobot policies.

A VLA policy maps camera images, a language instruction and the robot's proprioception to an
action chunk. Here those are an observation dict with ``"image"`` ``[N, H, W, 3]`` uint8 (the
camera group of a rendering env, channels last) and ``"policy"`` ``[N, D]`` float32 (the
proprioceptive vector), plus one instruction string per policy (a task has one goal sentence);
the output is a chunk ``[N, H_a, A]`` of actions in [-1, 1] that :mod:`embodied.action_chunks`
executes (``exec_steps`` of them before planning again).

:class:`LeRobotPolicy` wraps a LeRobot policy (ACT, diffusion, SmolVLA, pi0 ...; anything with
``predict_action_chunk(batch)``) as an embodied ``Policy``. It builds LeRobot's batch from the
observation dict (:func:`lerobot_batch`):

- ``observation.images.<camera>``: ``[N, 3, H, W]`` float32 in [0, 1] (LeRobot's image layout);
- ``observation.state``: ``[N, D]`` float32, the ``policy`` group as it is;
- ``task``: the instruction, one string per env;

and maps the chunk it returns from the policy's action range back to [-1, 1]
(:func:`actions_to_unit`). lerobot itself is never imported by this module: the wrapped policy
is built by the caller (in its own environment, ``scripts/setup_lerobot.sh``), so importing
``embodied.policies.vla`` costs nothing where lerobot is absent.

Shapes: ``N`` = batch (envs), ``H, W`` = image size, ``D`` = proprioception size,
``H_a`` = chunk length, ``A`` = action size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from embodied.action_chunks import ChunkExecutor, ChunkSpec
from embodied.algo import ExportUnsupportedError
from embodied.env import ObsDict
from embodied.errors import EmbodiedError

LEROBOT_IMAGE_PREFIX = "observation.images."
LEROBOT_STATE_KEY = "observation.state"
LEROBOT_TASK_KEY = "task"


class ChunkPredictor(Protocol):
    """What :class:`LeRobotPolicy` calls: LeRobot's ``PreTrainedPolicy`` has both methods."""

    def predict_action_chunk(self, batch: dict[str, Any]) -> torch.Tensor: ...

    def reset(self) -> None: ...


def images_to_float(images: torch.Tensor) -> torch.Tensor:
    """``[N, H, W, 3]`` uint8 -> ``[N, 3, H, W]`` float32 in [0, 1]; anything else is an error."""
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
        raise EmbodiedError(
            f"camera images must be [N, H, W, 3] uint8 (channels last), got {tuple(images.shape)} {images.dtype}"
        )
    return images.permute(0, 3, 1, 2).float() / 255.0


def lerobot_batch(obs: ObsDict, instruction: str, cameras: Mapping[str, str]) -> dict[str, Any]:
    """LeRobot's batch for an observation dict: ``cameras`` maps a LeRobot camera name
    (``observation.images.<name>``) to the observation group holding its images."""
    state = obs["policy"]
    batch: dict[str, Any] = {LEROBOT_STATE_KEY: state.float()}
    for name, group in cameras.items():
        if group not in obs:
            raise EmbodiedError(
                f"the LeRobot policy reads camera {name!r} from observation group {group!r}, which the env "
                f"does not produce (groups: {sorted(obs)}); run the task with a camera"
            )
        images = images_to_float(obs[group])
        if images.shape[0] != state.shape[0]:
            raise EmbodiedError(f"camera {name!r} has {images.shape[0]} images for {state.shape[0]} states")
        batch[LEROBOT_IMAGE_PREFIX + name] = images
    batch[LEROBOT_TASK_KEY] = [instruction] * state.shape[0]
    return batch


def actions_to_unit(actions: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Actions ``[..., A]`` in the policy's range ``[low, high]`` ``[A]`` -> [-1, 1] (clipped)."""
    return (2.0 * (actions - low) / (high - low) - 1.0).clamp(-1.0, 1.0)


class LeRobotPolicy(nn.Module):
    """An embodied ``Policy`` around a LeRobot policy (see the module docstring).

    ``action_low``/``action_high`` ``[A]``: the range of the wrapped policy's actions (the
    dataset it was trained on); by default [-1, 1], the range embodied's tasks act in.
    ``chunk_spec``: how the chunks run, usually ``ChunkSpec(config.chunk_size, config.n_action_steps)``.
    """

    action_low: torch.Tensor
    action_high: torch.Tensor

    def __init__(
        self,
        policy: ChunkPredictor,
        instruction: str,
        cameras: Mapping[str, str],
        chunk_spec: ChunkSpec,
        action_low: Sequence[float] | torch.Tensor | None = None,
        action_high: Sequence[float] | torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.lerobot = policy if isinstance(policy, nn.Module) else None
        self._policy = policy
        self.instruction = instruction
        self.cameras = dict(cameras)
        self.chunk_spec = chunk_spec
        """How this policy's chunks are executed (read by residual RL and evaluation)."""
        low = torch.as_tensor(-1.0 if action_low is None else action_low, dtype=torch.float32)
        high = torch.as_tensor(1.0 if action_high is None else action_high, dtype=torch.float32)
        if torch.any(high <= low):
            raise EmbodiedError(f"LeRobotPolicy: action_high must exceed action_low, got {high} <= {low}")
        self.register_buffer("action_low", low)
        self.register_buffer("action_high", high)
        self._executors: dict[bool, ChunkExecutor[torch.Tensor]] = {
            True: ChunkExecutor(None, chunk_spec),
            False: ChunkExecutor(None, chunk_spec),
        }

    @torch.no_grad()
    def plan(self, obs: ObsDict) -> torch.Tensor:
        """A chunk ``[N, H_a, A]`` in [-1, 1] for the observation dict."""
        chunk = self._policy.predict_action_chunk(lerobot_batch(obs, self.instruction, self.cameras))
        if chunk.dim() != 3 or chunk.shape[0] != obs["policy"].shape[0]:
            raise EmbodiedError(f"the LeRobot policy returned {tuple(chunk.shape)}, expected [N, H, A]")
        return actions_to_unit(chunk.float(), self.action_low, self.action_high)

    @torch.no_grad()
    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[N, A]``: the next action of the current chunk (a new plan every
        ``exec_steps`` calls). The wrapped policy decides its own sampling (ACT is deterministic;
        a diffusion policy draws noise), so ``deterministic`` only keeps the two schedules apart."""
        if not isinstance(obs, dict):
            raise EmbodiedError("a VLA policy needs the observation dict (images and the policy group), not a tensor")
        return self._executors[deterministic].step(obs["policy"], lambda _: self.plan(obs))

    def reset_plan(self) -> None:
        """Drop the chunks being executed and the wrapped policy's own queues."""
        for executor in self._executors.values():
            executor.reset()
        self._policy.reset()

    def export_module(self) -> nn.Module:
        raise ExportUnsupportedError(
            "a LeRobot policy is exported with LeRobot's own tools; embodied exports its own policies "
            "(the VLA-shaped flow policy exports to ONNX: docs/finetuning.md, VLA)"
        )
