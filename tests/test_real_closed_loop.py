"""quad-hover flown over real Cyclone DDS on loopback by two processes: `embodied sim-robot`
publishes odometry and applies motor commands, `embodied deploy` runs the exported policy.
The outcome must match the same policy evaluated in-process on the same episodes.

Both sides use the task without observation noise: the node observes the published (exact)
state, and noise draws would also shift the env's random stream, so later episodes would start
from different states and the comparison would measure sampling luck instead of the loop."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from real_support import free_domain_id, quad_robot, write_robot_variant

from embodied import registry
from embodied.export.bundle import export_module
from embodied.real.runner import PolicyRunner
from embodied.training.run import load_run

CLI = [sys.executable, "-m", "embodied.cli"]
EPISODES = 8
SEED = 7
NOISE_FREE = ["obs_noise_std=[0,0,0,0]"]


def _env_cfg(robot: Path) -> Any:
    """The task as ``sim-robot --robot robot`` serves it (``served_env_cfg``): noise-free, and
    holding the robot config's setpoint where the training config draws a setpoint yaw per
    episode. Without the held setpoint the two sides fly different episodes from the second one
    on (a policy trained on one AMD EPYC fell in episode 2 under one and not the other)."""
    from embodied.commands.sim_robot import served_env_cfg
    from embodied.real.robot_config import load_robot

    return served_env_cfg(registry.task_cfg("quad-hover"), load_robot(robot), NOISE_FREE)


@pytest.fixture(scope="session")
def hover_export(hover_ppo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short PPO run of quad-hover (shipped config, cached across tests) exported to ONNX."""
    run = load_run(hover_ppo_run)
    export = tmp_path_factory.mktemp("hover_export")
    export_module(run.policy.export_module(), run.io_spec, export, "onnx")
    return export


def in_process(export: Path, robot: Path, episodes: int, seed: int) -> tuple[float, list[int]]:
    """``(success rate, steps of each episode)`` of the single-env episode sequence sim-robot
    flies for ``robot``, with the policy called directly on the env's observation."""
    runner = PolicyRunner(export)
    env = registry.make_env("quad-hover", _env_cfg(robot), 1, "cpu", seed)
    obs = env.reset(seed=seed)
    successes = steps = 0
    lengths: list[int] = []
    while len(lengths) < episodes:
        action = torch.from_numpy(runner(obs["policy"][0].numpy())).reshape(1, -1)
        obs, _reward, terminated, truncated, info = env.step(action)
        steps += 1
        if bool(terminated[0] | truncated[0]):
            lengths.append(steps)
            steps = 0
            successes += int(bool(info["success"][0]))
    return successes / episodes, lengths


@pytest.mark.slow  # trains a short PPO run first (minutes on 2 cores)
def test_hover_over_dds_matches_in_process_eval(hover_export: Path, tmp_path: Path) -> None:
    # The shipped config (freshness limits derived from the policy's rate), with the training
    # envelope opened wide: this test is about the DDS loop reproducing the in-process evaluation,
    # which has no envelope; a short-trained policy's recoveries leave the default envelope
    # (tilt beyond 1.6 rad). The envelope is tested in test_real_safety.py and test_real_fuzz.py.
    wide = {k: 1e9 for k in ("pos_err_m", "tilt_rad", "ang_vel_rad_s", "lin_vel_m_s")}
    robot = write_robot_variant(tmp_path, quad_robot(), {"safety.envelope_limits": wide})
    domain = str(free_domain_id())
    common = ["--robot", str(robot), "--transport", "dds", "--loopback", "--domain-id", domain]
    env_args = [a for kv in NOISE_FREE for a in ("--env", kv)]
    # Both processes start first: their start-up overlaps with the in-process reference run.
    node = subprocess.Popen(
        [*CLI, "deploy", str(hover_export), *common, "--no-live", "--duration", "120", "--use-sim-time"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sim = subprocess.Popen(
        [
            *CLI,
            "sim-robot",
            "quad-hover",
            *common,
            "--episodes",
            str(EPISODES),
            "--seed",
            str(SEED),
            "--json",
            *env_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        success_ref, lengths_ref = in_process(hover_export, robot, EPISODES, SEED)
        sim_out, sim_err = sim.communicate(timeout=100)
    finally:
        sim.kill()
        node.terminate()
        node_out, _ = node.communicate(timeout=20)
    # An untrained policy falls out of the box within ~100 steps; this one must fly for real.
    length_ref = sum(lengths_ref) / EPISODES
    assert length_ref >= 200, f"fixture policy survives only {length_ref:.0f} steps on average"
    assert sim.returncode == 0, sim_err + sim_out + node_out
    summary = json.loads(sim_out.strip().splitlines()[-1])
    assert summary["episodes"] == EPISODES and summary["missed_commands"] == 0
    assert summary["safe_commands"] == 0, (summary, node_out)  # no spurious motors-off
    # The node computes the observation in float64 (numpy) where the task uses float32, so an
    # episode that ends right at the 0.1 m success radius may land on the other side: one episode
    # either way is allowed, the episode lengths (below) must agree closely.
    assert abs(summary["success_rate"] - success_ref) <= 1.0 / EPISODES + 1e-9, (summary, success_ref)
    assert summary["mean_episode_steps"] == pytest.approx(length_ref, rel=0.05), (summary, lengths_ref)
    # The node flew every step at its own rate, no bad data; it answered SIGTERM with the safe command.
    status = node_out.strip().splitlines()[-1]
    errors_field = re.search(r"\| errors (\d+)(?: \||$)", status)
    assert errors_field is not None, status
    errors = int(errors_field.group(1))
    # Errors allowed: sim-robot leaving at the end, seen as its publisher going away; and, for each
    # tick whose state did not arrive within the sim-time wait (a stall of the shared CI host over
    # sim_input_wait.WAIT_S, or a best-effort state message lost: both seen in CI, once in ~10
    # runs), that timeout and the hold it causes. Each of those is logged; no other error passes.
    timeouts = node_out.count("did not arrive within")
    left = int("every publisher of cf/odom left" in status)
    assert timeouts <= 2 and errors <= left + 2 * timeouts, node_out
    assert "safe command [0.0, 0.0, 0.0, 0.0] sent" in node_out, node_out
