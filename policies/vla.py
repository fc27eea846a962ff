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
(:func:`actions_to_unit`). The wrapped policy is built by the caller (in its own environment,
``scripts/setup_lerobot.sh``); lerobot is imported only when a policy that keeps its observations
in queues (diffusion) plans, so importing ``embodied.policies.vla`` costs nothing where lerobot is
absent.

Shapes: ``N`` = batch (envs), ``H, W`` = image size, ``D`` = proprioception size,
``H_a`` = chunk length, ``A`` = action size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from embodied.action_chunks import ChunkExecutor, ChunkSpec
from embodied.algo import ExportUnsupportedError
from embodied.env import ObsDict
from embodied.errors import EmbodiedError, import_optional

LEROBOT_IMAGE_PREFIX = "observation.images."
LEROBOT_STATE_KEY = "observation.state"
LEROBOT_TASK_KEY = "task"
LEROBOT_ACTION_KEY = "action"
LEROBOT_IMAGES_KEY = "observation.images"
"""All cameras stacked ``[N, n_cameras, 3, H, W]``: the key a diffusion policy queues its images under."""
OBSERVATION_QUEUE_TYPES = frozenset({"diffusion"})
"""LeRobot policy types (``config.type``) whose ``predict_action_chunk`` reads the observations
from the policy's own queues, which only its ``select_action`` fills."""


class ChunkPredictor(Protocol):
    """What :class:`LeRobotPolicy` calls: LeRobot's ``PreTrainedPolicy`` has these methods
    (``select_action`` only with ``lerobot_queue=True``)."""

    def predict_action_chunk(self, batch: dict[str, Any]) -> torch.Tensor: ...

    def reset(self) -> None: ...


Processor = Callable[[Any], Any]
"""A LeRobot processor pipeline (``policy_preprocessor``: batch -> batch; ``policy_postprocessor``:
action tensor -> action tensor), or any callable of that form."""


def _identity(value: Any) -> Any:
    return value


def images_to_float(images: torch.Tensor) -> torch.Tensor:
    """``[N, H, W, 3]`` uint8 -> ``[N, 3, H, W]`` float32 in [0, 1]; anything else is an error."""
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
        raise EmbodiedError(
            f"camera images must be [N, H, W, 3] uint8 (channels last), got {tuple(images.shape)} {images.dtype}"
        )
    return images.permute(0, 3, 1, 2).float() / 255.0


def lerobot_batch(
    obs: ObsDict, instruction: str, cameras: Mapping[str, str], state_group: str = "policy"
) -> dict[str, Any]:
    """LeRobot's batch for an observation dict: ``cameras`` maps a LeRobot camera name
    (``observation.images.<name>``) to the observation group holding its images;
    ``state_group`` is the group sent as ``observation.state``."""
    state = obs[state_group]
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


def unit_to_actions(unit: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`actions_to_unit`: actions ``[..., A]`` in [-1, 1] -> the policy's
    range ``[low, high]`` ``[A]``."""
    return low + 0.5 * (unit + 1.0) * (high - low)


class LeRobotPolicy(nn.Module):
    """An embodied ``Policy`` around a LeRobot policy (see the module docstring).

    ``action_low``/``action_high`` ``[A]``: the range of the wrapped policy's actions (the
    dataset it was trained on); by default [-1, 1], the range embodied's tasks act in.
    ``chunk_spec``: how the chunks run, usually ``ChunkSpec(config.chunk_size, config.n_action_steps)``.
    ``preprocessor``/``postprocessor``: the checkpoint's processor pipelines (normalization,
    tokenization, device), applied around every call of the wrapped policy; identity by default.
    ``lerobot_queue``: act through the wrapped policy's own ``select_action`` (LeRobot's action
    queue, observation history and ensembling: exactly what LeRobot's evaluation runs) instead
    of embodied's chunk runner. ``state_group``: the observation group sent as ``observation.state``.
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
        preprocessor: Processor | None = None,
        postprocessor: Processor | None = None,
        lerobot_queue: bool = False,
        state_group: str = "policy",
    ) -> None:
        super().__init__()
        self.preprocessor: Processor = preprocessor or _identity
        self.postprocessor: Processor = postprocessor or _identity
        self.lerobot_queue = lerobot_queue
        self.state_group = state_group
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

    def _batch(self, obs: ObsDict) -> dict[str, Any]:
        """The preprocessed LeRobot batch of an observation dict."""
        return self.preprocessor(lerobot_batch(obs, self.instruction, self.cameras, self.state_group))

    def _queue_observation(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch for ``predict_action_chunk``, after doing what ``select_action`` does first
        for a policy of :data:`OBSERVATION_QUEUE_TYPES`: drop the action entry, stack the
        cameras into :data:`LEROBOT_IMAGES_KEY` and append the observation to the policy's
        queues with LeRobot's own ``populate_queues``. With one observation of history (``plan``
        refuses more) those queues then hold exactly this batch: the plan depends on no earlier
        call (episode, batch size), and the action queue ``select_action`` executes from is
        left alone."""
        config: Any = getattr(self._policy, "config", None)
        if getattr(config, "type", None) not in OBSERVATION_QUEUE_TYPES:
            return batch
        utils = import_optional(
            "lerobot.policies.utils", f"planning with a LeRobot {config.type} policy", "bash scripts/setup_lerobot.sh"
        )
        # the processors pass an (empty) action entry through; select_action drops it before queueing
        batch = {key: value for key, value in batch.items() if key != LEROBOT_ACTION_KEY}
        if config.image_features:
            batch[LEROBOT_IMAGES_KEY] = torch.stack([batch[key] for key in config.image_features], dim=-4)
        utils.populate_queues(getattr(self._policy, "_queues"), batch)  # noqa: B009  # LeRobot's attribute
        return batch

    @torch.no_grad()
    def plan(self, obs: ObsDict) -> torch.Tensor:
        """A chunk ``[N, H_a, A]`` in [-1, 1] for the observation dict (a fresh plan: the wrapped
        policy's ``predict_action_chunk``, through the processors). A policy that conditions on
        an observation history (diffusion's ``n_obs_steps`` > 1) has no fresh plan of one
        observation and is refused."""
        history = int(getattr(getattr(self._policy, "config", None), "n_obs_steps", 1))
        if history > 1:
            raise EmbodiedError(
                f"{type(self._policy).__name__} conditions on its last {history} observations (n_obs_steps={history}), "
                "so it has no plan of one observation, which residual RL needs (and the chunk runner, "
                "lerobot_queue=False); train the LeRobot policy with n_obs_steps=1 (lerobot-train "
                "--policy.n_obs_steps=1). `embodied eval lerobot:PATH` runs it as it is, history included"
            )
        batch = self._queue_observation(self._batch(obs))
        chunk = self.postprocessor(self._policy.predict_action_chunk(batch))
        if chunk.dim() != 3 or chunk.shape[0] != obs[self.state_group].shape[0]:
            raise EmbodiedError(f"the LeRobot policy returned {tuple(chunk.shape)}, expected [N, H, A]")
        return actions_to_unit(chunk.float().cpu(), self.action_low, self.action_high)

    @torch.no_grad()
    def lerobot_action(self, obs: ObsDict) -> torch.Tensor:
        """``[N, A]`` in [-1, 1]: the next action of the wrapped policy's own ``select_action``."""
        select = getattr(self._policy, "select_action", None)
        if select is None:
            raise EmbodiedError(
                f"{type(self._policy).__name__} has no select_action; build LeRobotPolicy with lerobot_queue=False"
            )
        action = self.postprocessor(select(self._batch(obs)))
        return actions_to_unit(action.float().cpu(), self.action_low, self.action_high)

    @torch.no_grad()
    def act(self, obs: ObsDict | torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions ``[N, A]``: the next action of the current chunk (a new plan every
        ``exec_steps`` calls; with ``lerobot_queue`` the wrapped policy's own queue decides). The
        wrapped policy decides its own sampling (ACT is deterministic; a diffusion policy draws
        noise), so ``deterministic`` only keeps the two schedules apart."""
        if not isinstance(obs, dict):
            raise EmbodiedError("a VLA policy needs the observation dict (images and the policy group), not a tensor")
        if self.lerobot_queue:
            return self.lerobot_action(obs)
        return self._executors[deterministic].step(obs[self.state_group], lambda _: self.plan(obs))

    def reset_plan(self) -> None:
        """Drop the chunks being executed and the wrapped policy's own queues."""
        for executor in self._executors.values():
            executor.reset()
        self._policy.reset()

    def export_module(self) -> nn.Module:
        raise ExportUnsupportedError(
            "a LeRobot policy is exported with LeRobot's own tools; embodied exports its own policies "
            "(the image-instruction flow policy exports to ONNX: docs/finetuning.md, VLA)"
        )
