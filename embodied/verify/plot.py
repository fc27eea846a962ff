"""``verify.png``: success against each perturbation, and the same starts flown in torch and MuJoCo."""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from embodied.eval_cfg import quiet_task_cfg
from embodied.io_spec import IOSpec
from embodied.verify.episodes import ArrayPolicy, EpisodeRules, InitialStates, run_episodes, sample_initial_states

log = logging.getLogger(__name__)


def _takes_yaw(env: Any) -> bool:
    """Whether the task's ``set_physical_state`` sets the setpoint yaw (the heading frame)."""
    import inspect

    return "yaw_sp_rad" in inspect.signature(env.set_physical_state).parameters


def _torch_trajectories(
    run_dir: Path, policy: ArrayPolicy, starts: InitialStates, steps: int, initial_action: float
) -> np.ndarray | None:
    """``[K, steps + 1, 3]`` position error in the run's own task from ``starts`` (None when the
    task cannot be put into a given state)."""
    import torch

    from embodied import registry
    from embodied.experiment import load_experiment
    from embodied.training.run import CONFIG_FILE

    cfg = load_experiment(run_dir / CONFIG_FILE)
    k = starts.position_w.shape[0]
    # The quadrotor task's state setters are not part of the VecEnv contract: probed below.
    env: Any = registry.make_env(cfg.task_name, quiet_task_cfg(cfg.env), k, "cpu", 0)
    try:
        if not hasattr(env, "set_physical_state"):
            log.info("%s cannot be set to a given state: no torch trajectories in the plot", cfg.task_name)
            return None
        env.reset(seed=0)
        f32 = torch.float32
        obs = env.set_physical_state(
            position_w=torch.as_tensor(starts.position_w, dtype=f32),
            quat_wb=torch.as_tensor(starts.quat_wb, dtype=f32),
            lin_vel_w=torch.as_tensor(starts.lin_vel_w, dtype=f32),
            ang_vel_b=torch.as_tensor(starts.ang_vel_b, dtype=f32),
            episode_step=0,
            action_hist=torch.full((k, env.action_hist.shape[1]), initial_action),
            **({"yaw_sp_rad": torch.as_tensor(starts.yaw_sp_rad, dtype=f32)} if _takes_yaw(env) else {}),
        )
        setpoint = env.physical_state()["setpoint_w"].numpy()
        traj = np.full((k, steps + 1, 3), np.nan)
        traj[:, 0] = starts.position_w - setpoint
        alive = np.ones(k, dtype=bool)
        for step in range(1, steps + 1):
            action = policy(obs["policy"].numpy())
            obs, _, terminated, truncated, _ = env.step(torch.as_tensor(action))
            # Ended envs restart at once (auto-reset): their trace stops here.
            alive &= ~(terminated.numpy() | truncated.numpy())
            pos = env.physical_state()["position_w"].numpy() - setpoint
            traj[:, step] = np.where(alive[:, None], pos, np.nan)
            if not alive.any():
                break
        return traj
    finally:
        env.close()


def compare_trajectories(
    run_dir: Path, policy: ArrayPolicy, spec: IOSpec, options: Any, source: str
) -> tuple[np.ndarray | None, np.ndarray]:
    """The same ``options.trajectories`` starts (setpoint yaw 0, no noise, no disturbance) flown
    in the run's torch task and in MuJoCo: ``(torch [K, T+1, 3] or None, mujoco [K, T+1, 3])``."""
    # No level-at-setpoint starts: every trace shows a recovery from a displaced, tilted start.
    rules = dataclasses.replace(
        EpisodeRules.from_spec(spec, source),
        any_yaw=False,
        init_level_fraction=0.0,
        disturbance_force_std_n=0.0,
        disturbance_torque_std_nm=0.0,
    )
    rng = np.random.default_rng(options.seed + 7)
    starts = sample_initial_states(rules, max(1, options.trajectories), rng)
    k = starts.position_w.shape[0]
    mujoco = run_episodes(
        policy, spec, k, options.seed, substeps=options.substeps, record=k, source=source, initial=starts, noise=False
    ).trajectories
    initial_action = float(spec.extra.get("prev_actions_at_reset", spec.extra.get("hover_action", 0.0)))
    try:
        torch_traj = _torch_trajectories(run_dir, policy, starts, rules.episode_steps, initial_action)
    except (AttributeError, TypeError, KeyError) as err:  # a task without the raw-state accessors
        log.warning("no torch trajectories in the plot: %s", err)
        torch_traj = None
    return torch_traj, mujoco


def write_plot(
    path: Path,
    sweep_rows: list[dict[str, Any]],
    traj_torch: np.ndarray | None,
    traj_mujoco: np.ndarray,
    rates: dict[str, float],
    dt_s: float = 0.01,
) -> None:
    """Success vs each perturbation knob, the main success rates, and distance-to-setpoint traces."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    knobs = list(dict.fromkeys(r["knob"] for r in sweep_rows))
    panels = len(knobs) + 2
    cols = 4
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax, knob in zip(flat, knobs):
        points = sorted((r["value"], r["success_rate"]) for r in sweep_rows if r["knob"] == knob)
        nominal = 0.0 if knob in ("obs_delay_steps", "thrust_mismatch", "yaw_torque_nm") else 1.0
        xs = [nominal] + [p[0] for p in points]
        ys = [rates.get("mujoco", math.nan)] + [p[1] for p in points]
        order = np.argsort(xs)
        ax.plot(np.asarray(xs)[order], np.asarray(ys)[order], "o-")
        ax.set_title(knob)
        ax.set_ylim(-0.05, 1.05)
        ax.set_ylabel("MuJoCo success")
        ax.grid(alpha=0.3)
    ax = flat[len(knobs)]
    # The L2F-start recovery bar stands beside the MuJoCo bar of the run's own starts.
    colors = {"torch": "tab:blue", "mujoco": "tab:orange", "mujoco_l2f": "tab:red", "firmware": "tab:green"}
    names = [n for n in colors if n in rates]
    labels = {"mujoco_l2f": "mujoco\nL2F starts"}
    ax.bar([labels.get(n, n) for n in names], [rates[n] for n in names], color=[colors[n] for n in names])
    ax.set_ylim(0, 1.05)
    ax.set_title("success, nominal vehicle")
    ax = flat[len(knobs) + 1]
    t = np.arange(traj_mujoco.shape[1]) * dt_s
    for i in range(traj_mujoco.shape[0]):
        color = f"C{i}"
        ax.plot(t, np.linalg.norm(traj_mujoco[i], axis=1), "--", color=color, label="MuJoCo" if i == 0 else None)
        if traj_torch is not None:
            ax.plot(t, np.linalg.norm(traj_torch[i], axis=1), "-", color=color, label="torch" if i == 0 else None)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("distance to setpoint (m)")
    ax.set_title("same starts, torch vs MuJoCo")
    ax.legend()
    for ax in flat[panels:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
