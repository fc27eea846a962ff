"""Software-in-the-loop: fly the quad-hover env with the firmware's own C code.

Each control step reads the raw physical state of every env (``QuadHover.physical_state``:
position, quaternion, velocity, body rates, setpoint), and hands it to the host build of the
firmware code, which assembles the observation itself (``firmware/common/quad_ctrl.c``: the
same code the Crazyflie app runs), runs the generated C policy and keeps its own action
history. The env's observation tensor is ignored, so any disagreement between the simulator's
and the firmware's observation shows up as a worse evaluation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.crazyflie.firmware_build import build_host_library
from embodied.crazyflie.vehicle import require_crazyflie
from embodied.env import ObsDict, PhysicalStateEnv
from embodied.errors import EmbodiedError
from embodied.export.bundle import c_dir, export_dir, host_dir
from embodied.export.host_lib import HostPolicyLib
from embodied.export.policy_io import read_policy_io

log = logging.getLogger(__name__)

_STATE_KEYS = ("position_w", "quat_wb", "lin_vel_w", "ang_vel_b")


def packed_state(env: object) -> tuple[np.ndarray, np.ndarray]:
    """``(states [N, 13], setpoints [N, 4])`` float32 from the env's raw-state accessor; a
    setpoint row is the world position (m) and the yaw (rad) that defines the heading frame, and
    for a moving setpoint (``vel_sp_w`` in the raw state) ``[N, 10]`` with the feed-forward
    velocity (m/s) and acceleration (m/s²) after them (``host_lib.MOVING_SETPOINT_FLOATS``)."""
    if not isinstance(env, PhysicalStateEnv):
        raise EmbodiedError(
            f"{type(env).__name__} exposes no physical_state(); software-in-the-loop needs the quad-hover task"
        )
    raw = env.physical_state()
    states = torch.cat([raw[k].float() for k in _STATE_KEYS], dim=1).cpu().numpy()
    n = states.shape[0]
    position = np.broadcast_to(raw["setpoint_w"].float().cpu().numpy(), (n, 3))
    yaw = raw["yaw_sp_rad"].float().cpu().numpy().reshape(n, 1) if "yaw_sp_rad" in raw else np.zeros((n, 1), np.float32)
    rows = [position, yaw]
    if "vel_sp_w" in raw:  # a moving setpoint (quad-track): feed-forward velocity and acceleration too
        rows += [raw["vel_sp_w"].float().cpu().numpy(), raw["acc_sp_w"].float().cpu().numpy()]
    return np.ascontiguousarray(states), np.ascontiguousarray(np.concatenate(rows, axis=1), np.float32)


def load_sil_library(run_dir: Path) -> HostPolicyLib:
    """Build (once per model hash) and load the host library of ``RUN_DIR/export/c``
    (``embodied export RUN_DIR --format c`` writes it)."""
    policy_io = read_policy_io(export_dir(run_dir))
    require_crazyflie(policy_io, "software-in-the-loop with the firmware controller")
    # One folder per model hash: ctypes cannot reload a path it already opened in this process.
    build = host_dir(run_dir) / f"sil-{policy_io.model_sha256[:12]}"
    path = build / "libembodied_policy.so"
    lib = HostPolicyLib(path if path.is_file() else build_host_library(c_dir(run_dir), build))
    if lib.model_sha256 != policy_io.model_sha256:
        raise EmbodiedError(f"{c_dir(run_dir)} was generated for another model than {policy_io.path}; re-export")
    return lib


def load_sil_policy(run_dir: Path, env: Any) -> Callable[[ObsDict], torch.Tensor]:
    """``embodied eval --policy c``: a callable ``obs -> action [N, 4]`` computed by the firmware C code.

    Contexts (action histories) are reset whenever an env starts a new episode
    (``env.episode_step == 0``), filled with ``extra.hover_action`` like the task does.
    """
    lib = load_sil_library(run_dir)
    spec = read_policy_io(export_dir(run_dir)).io_spec
    period_us = round(float(env.dt) * 1e6)
    if period_us != lib.control_period_us:
        raise EmbodiedError(
            f"the env steps every {period_us} us but the exported policy runs every {lib.control_period_us} us"
        )
    initial_action = float(spec.extra.get("hover_action", 0.0))
    ctxs = lib.new_contexts(int(env.num_envs), initial_action)
    if hasattr(env, "physical_actions"):  # the C code's commands are in M1..M4 labels (no task-side flip)
        env.physical_actions = True
    device = env.device

    def act(obs: ObsDict) -> torch.Tensor:
        del obs  # the firmware builds its own observation from the raw state
        fresh = (env.episode_step == 0).cpu().numpy()
        if fresh.any():
            lib.reset(ctxs, fresh, initial_action)
        states, setpoints = packed_state(env)
        return torch.from_numpy(lib.step(ctxs, states, setpoints)).to(device)

    return act


EVAL_LOADERS: dict[str, Callable[[Path, Any], Callable[[ObsDict], torch.Tensor]]] = {"c": load_sil_policy}
"""``embodied eval --policy NAME`` for Crazyflie policies, in place of the format's own loader:
``c`` flies the firmware controller (observation assembly included), not the bare network."""
