"""The ROS 2 node's observation of a moving goal (crazyflie_track.yaml: odometry, goal pose, twist and
acceleration on geometry_msgs topics) equals the quad-track task's observation of the same state."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from real_support import odometry

from embodied.config import ConfigError
from embodied.real import messages
from embodied.real.observation import ObservationBuilder, ObservationError, quat_to_rotmat
from embodied.real.robot_config import ROBOTS_DIR, load_robot
from embodied.tasks.quadrotor.track import QuadTrack, QuadTrackCfg

TRACK_ROBOT = ROBOTS_DIR / "crazyflie_track.yaml"


def _stamped(type_name: str, body: dict[str, Any]) -> Any:
    sec, nanosec = divmod(time.time_ns(), 1_000_000_000)
    header = {"frame_id": "world", "stamp": {"sec": sec, "nanosec": nanosec}}
    return messages.make(type_name, {"header": header, **body})


def _xyz(v: Any) -> dict[str, float]:
    return {"x": float(v[0]), "y": float(v[1]), "z": float(v[2])}


def goal_messages(position_w: Any, yaw_rad: float, vel_w: Any, acc_w: Any) -> dict[str, Any]:
    """The goal as a trajectory publisher streams it: PoseStamped, TwistStamped, AccelStamped (world)."""
    quat = {"x": 0.0, "y": 0.0, "z": math.sin(yaw_rad / 2), "w": math.cos(yaw_rad / 2)}
    zero = _xyz((0.0, 0.0, 0.0))
    return {
        "goal": _stamped(
            "geometry_msgs/msg/PoseStamped", {"pose": {"position": _xyz(position_w), "orientation": quat}}
        ),
        "goal_twist": _stamped("geometry_msgs/msg/TwistStamped", {"twist": {"linear": _xyz(vel_w), "angular": zero}}),
        "goal_accel": _stamped("geometry_msgs/msg/AccelStamped", {"accel": {"linear": _xyz(acc_w), "angular": zero}}),
    }


def test_node_observation_of_a_moving_goal_matches_the_task() -> None:
    # the physical observation (the exported policy applies the yaw flip itself), as the node builds it
    cfg = QuadTrackCfg(
        path="mix",
        action_history=1,
        pos_err_integral=True,
        obs_noise_std=(0.0,) * 4,
        episode_steps=30,
        yaw_symmetry=False,
    )
    env = QuadTrack(cfg, 1, torch.device("cpu"), seed=3)
    builder = ObservationBuilder(load_robot(TRACK_ROBOT), env.io_spec())
    obs_task = env.observe(noise=False)["policy"][0].numpy()
    assert obs_task.shape == (3 + 9 + 3 + 3 + 3 + 3 + 4,)
    peak_acc = peak_yaw = 0.0
    for _ in range(70):  # two restarts: the node re-arms (history and integral reset) like an episode start
        if env.episode_step[0] == 0:
            builder.history.reset()
        s = {k: v[0].numpy() for k, v in env.physical_state().items()}
        w, x, y, z = s["quat_wb"]
        lin_vel_b = quat_to_rotmat(s["quat_wb"].astype(np.float64)).T @ s["lin_vel_w"]
        latest = {
            "odom": odometry(
                pos_w=s["position_w"], quat_xyzw=(x, y, z, w), lin_vel_b=lin_vel_b, ang_vel_b=s["ang_vel_b"]
            ),
            **goal_messages(s["setpoint_w"], float(s["yaw_sp_rad"]), s["vel_sp_w"], s["acc_sp_w"]),
        }
        np.testing.assert_allclose(builder.build(latest), obs_task, atol=3e-6, rtol=0)
        peak_acc = max(peak_acc, float(np.abs(obs_task[18:21]).max()))
        peak_yaw = max(peak_yaw, abs(float(s["yaw_sp_rad"])))
        action = np.full(4, env.hover_action) + np.array([0.04, 0.0, -0.03, 0.01])
        builder.history.push(action)
        obs_task = env.step(torch.from_numpy(action).float()[None])[0]["policy"][0].numpy()
    assert peak_acc > 0.3 and peak_yaw > 0.5  # feed-forward and heading both exercised


def test_goal_quaternion_errors_and_bad_goal_ops(tmp_path: Path) -> None:
    env = QuadTrack(QuadTrackCfg(action_history=1), 1, torch.device("cpu"), seed=0)
    builder = ObservationBuilder(load_robot(TRACK_ROBOT), env.io_spec())
    latest = {"odom": odometry(), **goal_messages((0.0, 0.0, 1.0), 0.0, (0, 0, 0), (0, 0, 0))}
    latest["goal"].pose.orientation.w = 0.0
    with pytest.raises(ObservationError, match="heading quaternion"):
        builder.build(latest)
    data = yaml.safe_load(TRACK_ROBOT.read_text())
    data["observation"]["pos_err_h"]["ops"][0] = {"subtract": {"input": "gaol", "path": "pose.position"}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="gaol"):
        ObservationBuilder(load_robot(bad), env.io_spec())
    data["observation"]["pos_err_h"]["ops"][0] = {"subtract": {"input": "goal", "path": "pose.orientation"}}
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="has 4 values but the signal has 3"):
        ObservationBuilder(load_robot(bad), env.io_spec())
