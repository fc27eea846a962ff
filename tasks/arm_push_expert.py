"""Scripted expert for arm-push: get behind the block, then push it along the goal line.

Works from the policy observation alone (base frame, ``tasks/arm_push.py`` layout), so it is
a drop-in ``obs -> action`` policy for collection and evaluation. Per env:

1. The push direction ``d`` points from block to goal, ``n`` is its left normal.
2. If the fingertip is behind the block on the push line (close to it, small lateral offset),
   it moves along ``d`` at ``push_speed`` while steering its lateral offset to zero.
3. Otherwise it heads for a staging point behind the block; when that path would cut through
   the block, it first goes to a waypoint beside the block (same side as it already is).

The fingertip velocity goes through damped least squares (``J^T (J J^T + l^2 I)^-1``) on the
arm's planar Jacobian, plus a null-space pull of the wrist towards a comfortable angle, and
is divided by the servo speed limit to give actions in [-1, 1].

Shapes: ``N`` = batch; observation ``[N, 18]``; action ``[N, 3]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embodied.tasks.arm_push import BLOCK_RADIUS_M, FINGERTIP_RADIUS_M, fingertip_jacobian

JOINT_SPEED_LIMIT_RAD_S = 2.5
"""The servos' control range in ``sim/assets/arm_push.xml``: action 1 = this speed."""


@dataclass(frozen=True)
class ExpertCfg:
    """Gains and distances of the scripted pusher (m, m/s)."""

    push_speed: float = 0.25
    approach_speed: float = 0.5
    approach_gain: float = 6.0
    """Fingertip speed per metre of distance to the staging point (1/s), capped at ``approach_speed``."""
    lateral_gain: float = 8.0
    """Lateral correction speed per metre of offset from the push line while pushing (1/s)."""
    standoff: float = 0.02
    """Gap kept behind the block's surface at the staging point."""
    aligned_lateral: float = 0.012
    """Largest lateral offset from the push line at which pushing starts."""
    damping: float = 0.05
    """Damped least-squares ``l`` (m)."""
    wrist_rest_rad: float = 0.8
    wrist_gain: float = 1.0


def expert_action(obs: np.ndarray, cfg: ExpertCfg = ExpertCfg()) -> np.ndarray:
    """Actions ``[N, 3]`` in [-1, 1] for observations ``[N, 18]`` (float64 or float32)."""
    q = obs[:, 0:3].astype(np.float64)
    tip = obs[:, 6:8].astype(np.float64)
    block = obs[:, 8:10].astype(np.float64)
    to_goal = obs[:, 14:16].astype(np.float64)
    dist = np.linalg.norm(to_goal, axis=1, keepdims=True)
    d = to_goal / np.maximum(dist, 1e-6)
    n = np.stack([-d[:, 1], d[:, 0]], axis=1)
    rel = tip - block
    along = (rel * d).sum(1)
    lateral = (rel * n).sum(1)
    contact = BLOCK_RADIUS_M + FINGERTIP_RADIUS_M

    behind = along < -0.6 * contact
    aligned = behind & (np.abs(lateral) < cfg.aligned_lateral) & (along > -contact - 2.5 * cfg.standoff)
    # pushing: along the goal line, steering the lateral offset to zero
    push_vel = cfg.push_speed * d - cfg.lateral_gain * lateral[:, None] * n

    # approaching: staging point behind the block, or a waypoint beside it if the straight path
    # would cross the block (the fingertip is level with or ahead of the block)
    stage = block - d * (contact + cfg.standoff)
    side = np.where(lateral >= 0.0, 1.0, -1.0)[:, None]
    beside = block + side * n * (contact + 2 * cfg.standoff) - d * (contact + cfg.standoff)
    blocked = (along > -contact) & (np.abs(lateral) < contact + cfg.standoff)
    target = np.where(blocked[:, None], beside, stage)
    err = target - tip
    speed = np.minimum(cfg.approach_gain * np.linalg.norm(err, axis=1, keepdims=True), cfg.approach_speed)
    approach_vel = err / np.maximum(np.linalg.norm(err, axis=1, keepdims=True), 1e-9) * speed

    tip_vel = np.where(aligned[:, None], push_vel, approach_vel)
    jac = fingertip_jacobian(q)  # [N, 2, 3]
    jjt = jac @ jac.transpose(0, 2, 1) + cfg.damping**2 * np.eye(2)
    pinv = jac.transpose(0, 2, 1) @ np.linalg.inv(jjt)  # [N, 3, 2]
    qd = (pinv @ tip_vel[:, :, None])[:, :, 0]
    # null-space motion keeps the wrist bent one way (away from the straight-arm singularity)
    null = np.eye(3) - pinv @ jac
    rest = np.zeros_like(q)
    rest[:, 2] = cfg.wrist_gain * (cfg.wrist_rest_rad - q[:, 2])
    qd += (null @ rest[:, :, None])[:, :, 0]
    return np.clip(qd / JOINT_SPEED_LIMIT_RAD_S, -1.0, 1.0)


class ScriptedExpert:
    """The expert as a policy: ``act(obs) -> action`` on torch tensors (``obs`` ObsDict or ``[N, 18]``)."""

    def __init__(self, cfg: ExpertCfg = ExpertCfg()) -> None:
        self.cfg = cfg

    def act(self, obs: dict[str, torch.Tensor] | torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        x = obs["policy"] if isinstance(obs, dict) else obs
        action = expert_action(x.detach().cpu().numpy(), self.cfg)
        return torch.from_numpy(action.astype(np.float32)).to(x.device)
