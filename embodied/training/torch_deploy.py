"""Policies that need torch on the robot computer, loaded for ``embodied deploy``: a LeRobot
checkpoint (``lerobot:<folder or hub id>``) and a run whose policy acts through a LeRobot module
(ReinFlow on a ``lerobot:`` base, residual RL on one). The deploy node's side of it is
:mod:`embodied.real.torch_runner`; this module holds everything that imports torch and LeRobot.

Loading is the evaluation's own: ``lerobot:REF`` goes through
:func:`~embodied.training.lerobot_base.load_lerobot_policy` (as ``embodied eval lerobot:REF``), a
run directory through :func:`~embodied.training.run.load_run` (as ``embodied eval RUN``). The
task's env is built once, without rendering, for its interface (observation layout, action
scales, control period: the :class:`~embodied.io_spec.IOSpec` the node builds observations and
commands from) and its proprioception size.

On the robot each control period gives the observation vector ``[D]`` float32 (the task's
``policy`` group, as the node assembles it) and the camera picture ``[H, W, 3]`` uint8 RGB (as
:mod:`embodied.real.camera_image` decodes it). They become the observation dict the policy acts
on in training and evaluation (``policy`` ``[1, D]``, ``image`` ``[1, H, W, 3]``), which
:func:`~embodied.policies.vla.lerobot_batch` turns into LeRobot's batch exactly as there. Actions
come from LeRobot's own ``select_action`` queue, so chunks run as the checkpoint runs them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied import registry
from embodied.data.lerobot_format import IMAGE_PREFIX
from embodied.env import IMAGE_GROUP
from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.policies.residual import ResidualPolicy
from embodied.policies.vla import LeRobotPolicy
from embodied.training.lerobot_base import is_lerobot_source, lerobot_config, load_lerobot_policy

log = logging.getLogger(__name__)

STATE_GROUP = "policy"
"""The observation group the deploy node assembles (its vector is the task's ``policy`` group)."""


def declared_cameras(config: Any) -> dict[str, tuple[int, int, int]]:
    """LeRobot camera name -> ``(H, W, C)`` of every ``observation.images.<name>`` a LeRobot policy
    config declares (LeRobot declares them channels first)."""
    out = {}
    for name, feature in config.input_features.items():
        if name.startswith(IMAGE_PREFIX):
            c, h, w = (int(v) for v in feature.shape)
            out[name[len(IMAGE_PREFIX) :]] = (h, w, c)
    return out


def refuse_cameras(cameras: dict[str, tuple[int, int, int]], source: str, robot_camera: str, robot_path: str) -> None:
    """Raise unless the robot config can feed the policy's cameras: at most one, and one camera
    input configured (``robot_camera``, "" for none) when the policy reads one."""
    if len(cameras) > 1:
        names = ", ".join(IMAGE_PREFIX + n for n in sorted(cameras))
        raise EmbodiedError(
            f"{source}: the policy reads {len(cameras)} cameras ({names}); robot config {robot_path} feeds one "
            "(its `camera: {input: NAME}`), so this policy cannot run on it"
        )
    if cameras and not robot_camera:
        (name, (h, w, c)) = next(iter(cameras.items()))
        raise EmbodiedError(
            f"{source}: the policy reads camera images ({IMAGE_PREFIX}{name}, {h}x{w}x{c} RGB) and robot config "
            f"{robot_path} has no camera: add `camera: {{input: NAME}}` naming an input of type "
            "sensor_msgs/msg/Image or sensor_msgs/msg/CompressedImage"
        )


@dataclass
class TorchDeployPolicy:
    """A loaded policy the deploy node feeds one observation at a time (see the module docstring).

    ``policy``: the module acting on an observation dict (``act(obs, deterministic=True) -> [1, A]``);
    ``lerobot``: the LeRobot wrapper inside it (itself, or a residual policy's base), which holds
    the instruction and LeRobot's queues; ``cameras``: LeRobot camera name -> ``(H, W, C)`` of the
    picture it reads (at most one); ``io_spec``: the task's interface."""

    source: str
    task: str
    policy: Any
    lerobot: LeRobotPolicy
    io_spec: IOSpec
    cameras: dict[str, tuple[int, int, int]]
    device: torch.device

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """``(H, W, C)`` of the picture the policy reads with each observation (None: no camera)."""
        return next(iter(self.cameras.values()), None)

    @property
    def instruction(self) -> str:
        """The text sent as LeRobot's ``task`` with every observation."""
        return self.lerobot.instruction

    def set_instruction(self, text: str) -> None:
        self.lerobot.instruction = text

    def reset(self) -> None:
        """Drop LeRobot's action queue (and observation history): the next call plans afresh."""
        self.lerobot.reset_plan()

    def act(self, obs: np.ndarray, image: np.ndarray | None) -> np.ndarray:
        """``obs [D]`` float32 (and ``image [H, W, 3]`` uint8 RGB) -> ``action [A]`` float32 in [-1, 1]."""
        groups = {STATE_GROUP: torch.as_tensor(np.asarray(obs, dtype=np.float32)[None], device=self.device)}
        if self.image_shape is not None:
            if image is None:
                raise EmbodiedError(f"{self.source}: this policy reads a camera image with each observation")
            groups[IMAGE_GROUP] = torch.as_tensor(np.ascontiguousarray(image, dtype=np.uint8)[None], device=self.device)
        with torch.inference_mode():
            action = self.policy.act(groups, deterministic=True)
        return np.asarray(action[0].detach().cpu().numpy(), dtype=np.float32)


def _task_interface(task: str) -> tuple[dict[str, tuple[int, ...]], int, IOSpec]:
    """``(obs_spec, action_dim, io_spec)`` of ``task``'s default env (one env, no rendering)."""
    env = registry.make_env(task, registry.task_cfg(task), 1, "cpu", 0)
    try:
        return dict(env.obs_spec), int(env.action_dim), env.io_spec()
    finally:
        env.close()


def lerobot_module_of(policy: Any) -> LeRobotPolicy | None:
    """The LeRobot wrapper a run's policy acts through: the policy itself (ReinFlow fine-tuned it
    in place) or its frozen base (a residual on a LeRobot base); None otherwise."""
    if isinstance(policy, LeRobotPolicy):
        return policy
    if isinstance(policy, ResidualPolicy) and isinstance(policy.base, LeRobotPolicy):
        return policy.base
    return None


def load_torch_deploy_policy(
    source: str | Path,
    task: str | None,
    robot_camera: str = "",
    robot_path: str = "the robot config",
    device: str = "cpu",
) -> TorchDeployPolicy:
    """Load ``lerobot:<ref>`` (for ``task``) or a run directory for the deploy node; refuses a
    policy the robot config cannot feed (``robot_camera``: its camera input, "" for none)."""
    dev = torch.device(device)
    if is_lerobot_source(source):
        return _load_lerobot(str(source), task, robot_camera, robot_path, dev)
    from embodied.training.run import load_run

    run = load_run(Path(source), device=dev)
    if task is not None and task != run.cfg.task_name:
        raise EmbodiedError(
            f"{source} was trained on {run.cfg.task_name!r}, the deploy names task {task!r} (--task or the robot "
            f"config's `task:`); a run directory deploys on its own task"
        )
    wrapper = lerobot_module_of(run.policy)
    if wrapper is None or wrapper.lerobot is None:
        raise EmbodiedError(
            f"{source}: its policy ({type(run.policy).__name__}) does not act through a LeRobot module; export it "
            f"(`embodied export {source}`) and deploy the ONNX export"
        )
    cameras = declared_cameras(wrapper.lerobot.config)
    refuse_cameras(cameras, str(source), robot_camera, robot_path)
    _refuse_state_group(wrapper, str(source))
    run.policy.eval()
    return TorchDeployPolicy(
        source=str(source),
        task=run.cfg.task_name,
        policy=run.policy,
        lerobot=wrapper,
        io_spec=run.io_spec,
        cameras=cameras,
        device=dev,
    )


def _load_lerobot(
    source: str, task: str | None, robot_camera: str, robot_path: str, dev: torch.device
) -> TorchDeployPolicy:
    if task is None:
        raise EmbodiedError(
            f"{source}: name the task whose observations and actions the policy was trained on: `--task NAME` or "
            f"`task: NAME` in robot config {robot_path} (e.g. arm-push; its LeRobot feature mapping is its row in "
            "embodied/data/lerobot_format.py, LEROBOT_TASKS)"
        )
    _, config = lerobot_config(source)
    cameras = declared_cameras(config)
    refuse_cameras(cameras, source, robot_camera, robot_path)
    obs_spec, action_dim, io_spec = _task_interface(task)
    camera = next(iter(cameras), None)
    if camera is not None:
        # the picture reaches the policy at the size it declares (the node decodes, or scales with
        # camera.resize, to that size), so the env's own rendering size does not enter
        obs_spec[IMAGE_GROUP] = cameras[camera]
    wrapper = load_lerobot_policy(source, task, obs_spec, action_dim, camera, dev)
    _refuse_state_group(wrapper, source)
    return TorchDeployPolicy(
        source=source,
        task=task,
        policy=wrapper,
        lerobot=wrapper,
        io_spec=io_spec,
        cameras=cameras,
        device=dev,
    )


def _refuse_state_group(wrapper: LeRobotPolicy, source: str) -> None:
    if wrapper.state_group != STATE_GROUP:
        raise EmbodiedError(
            f"{source}: the task's LeRobot mapping sends group {wrapper.state_group!r} as observation.state; the "
            f"deploy node assembles the {STATE_GROUP!r} group only"
        )
