"""The deploy node's runner for policies that need torch: a LeRobot checkpoint (``lerobot:REF``:
ACT, Diffusion or SmolVLA, the kinds run here; pi0-class policies go through the same loading
but have not been run; or a fine-tuned run exported with ``--format lerobot``) and a
run directory whose policy acts through a LeRobot module (ReinFlow or residual RL on a
``lerobot:`` base). It offers what :class:`~embodied.real.runner.PolicyRunner` offers the node
(:class:`~embodied.real.runner.DeployRunner`).

This is the one module of the deployment runtime that imports torch (through
:mod:`embodied.training.torch_deploy`, which loads the policy as ``embodied eval`` does); it is
imported only when :func:`embodied.real.deploy.open_runner` picks it, so an ONNX export still
deploys where torch is not installed (pyproject.toml's import contract names the exception). It
needs the LeRobot environment on the robot computer (``bash scripts/setup_lerobot.sh``).

Inputs: the observation vector the node assembles, the robot config's camera picture (decoded
to the ``[H, W, 3]`` uint8 RGB size the policy declares, ``camera.resize`` scaling another
size), and the robot config's ``instruction:`` as LeRobot's ``task`` text (default: the task's
training instruction). Each call returns the next action of LeRobot's own ``select_action``
queue; :meth:`TorchPolicyRunner.reset` empties the queue whenever the node is not driving, so
each (re)activation plans afresh.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.real.robot_config import RobotConfig

log = logging.getLogger(__name__)

SETUP_HINT = "bash scripts/setup_lerobot.sh, then deploy from .venv-lerobot"


def _torch_deploy() -> Any:
    """:mod:`embodied.training.torch_deploy`, or an error naming the LeRobot environment."""
    try:
        from embodied.training import torch_deploy
    except ImportError as err:
        raise EmbodiedError(
            f"this policy runs on torch and LeRobot, which this Python cannot import ({err}); install the LeRobot "
            f"environment: {SETUP_HINT}"
        ) from None
    return torch_deploy


class TorchPolicyRunner:
    """``runner(obs [obs_dim], image [H, W, C] | None) -> action [action_dim]`` float32 in [-1, 1],
    from a policy loaded for ``robot`` (see the module docstring).

    ``task``: the embodied task a ``lerobot:`` checkpoint was trained on (default: the robot
    config's ``task:``); ``device``: where torch runs it (``cpu``, ``cuda``)."""

    engine = "torch"

    def __init__(self, source: str | Path, robot: RobotConfig, task: str | None = None, device: str = "cpu") -> None:
        self.source = str(source)
        camera = robot.camera.input if robot.camera is not None else ""
        self._policy = _torch_deploy().load_torch_deploy_policy(
            source, task or robot.task or None, camera, str(robot.path), device
        )
        self.image_shape: tuple[int, int, int] | None = self._policy.image_shape
        """``(H, W, C)`` of the picture the policy declares (None: it reads no camera)."""
        self.trained_instruction: str = self._policy.instruction
        log.info("%s runs on torch (%s, task %s)", self.source, device, self._policy.task)

    @property
    def io_spec(self) -> IOSpec:
        return self._policy.io_spec

    @property
    def instruction(self) -> str:
        """The text sent as LeRobot's ``task`` with every observation."""
        return self._policy.instruction

    def prepare(self, robot: RobotConfig) -> None:
        """Refuse a robot config without the camera the policy reads; send its ``instruction:``
        (when set) as the task text from now on."""
        camera = robot.camera.input if robot.camera is not None else ""
        _torch_deploy().refuse_cameras(self._policy.cameras, self.source, camera, str(robot.path))
        if robot.instruction and robot.instruction != self.trained_instruction:
            log.info(
                "instruction: %r (the robot config's; trained with %r)", robot.instruction, self.trained_instruction
            )
            self._policy.set_instruction(robot.instruction)
        else:
            log.info("instruction: %r (the task's training instruction)", self.trained_instruction)

    def __call__(self, obs: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
        """``obs [obs_dim]`` (and ``image [H, W, C]`` uint8 for a camera policy) -> ``action
        [action_dim]`` float32, a fresh array: the next action of the policy's queue."""
        return self._policy.act(obs, image)

    def reset(self) -> None:
        """Empty LeRobot's action queue: the next call plans from its observation (the node re-arms)."""
        self._policy.reset()
