"""quad-hover flown over real Cyclone DDS on loopback by two processes: `embodied sim-robot`
publishes odometry and applies motor commands, `embodied deploy` runs the exported policy.
The outcome must match the same policy evaluated in-process on the same episodes.

Both sides use the task without observation noise: the node observes the published (exact)
state, and noise draws would also shift the env's random stream, so later episodes would start
from different states and the comparison would measure sampling luck instead of the loop."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from real_support import free_domain_id

from embodied import registry
from embodied.export.bundle import export_module
from embodied.real.robot_config import ROBOTS_DIR
from embodied.real.runner import PolicyRunner
from embodied.run import load_run

CLI = [sys.executable, "-m", "embodied.cli"]
EPISODES = 8
SEED = 7
NOISE_FREE = ["obs_noise_std=[0,0,0,0]"]


def _env_cfg() -> Any:
    return dataclasses.replace(registry.task_cfg("quad-hover"), obs_noise_std=(0.0, 0.0, 0.0, 0.0))


@pytest.fixture(scope="session")
def hover_export(hover_ppo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short PPO run of quad-hover (shipped config, cached across tests) exported to ONNX."""
    run = load_run(hover_ppo_run)
    export = tmp_path_factory.mktemp("hover_export")
    export_module(run.policy.export_module(), run.io_spec, export, "onnx")
    return export


def in_process(export: Path, episodes: int, seed: int) -> tuple[float, float]:
    """``(success rate, mean episode steps)`` of the single-env episode sequence sim-robot flies,
    with the policy called directly on the env's observation."""
    runner = PolicyRunner(export)
    env = registry.make_env("quad-hover", _env_cfg(), 1, "cpu", seed)
    obs = env.reset(seed=seed)
    successes = done = steps = 0
    while done < episodes:
        action = torch.from_numpy(runner(obs["policy"][0].numpy())).reshape(1, -1)
        obs, _reward, terminated, truncated, info = env.step(action)
        steps += 1
        if bool(terminated[0] | truncated[0]):
            done += 1
            successes += int(bool(info["success"][0]))
    return successes / episodes, steps / episodes


def lockstep_robot(tmp_path: Path) -> Path:
    """crazyflie_sim with a watchdog timeout that tolerates scheduler hiccups of a loaded 2-core
    machine: in lockstep the sensor rate is set by the simulator, not by a real clock."""
    data = yaml.safe_load((ROBOTS_DIR / "crazyflie_sim.yaml").read_text())
    data["inputs"]["odom"]["stale_timeout_s"] = 0.5
    path = tmp_path / "crazyflie_lockstep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_hover_over_dds_matches_in_process_eval(hover_export: Path, tmp_path: Path) -> None:
    robot = lockstep_robot(tmp_path)
    domain = str(free_domain_id())
    common = ["--robot", str(robot), "--transport", "dds", "--loopback", "--domain-id", domain]
    env_args = [a for kv in NOISE_FREE for a in ("--env", kv)]
    # Both processes start first: their start-up overlaps with the in-process reference run.
    node = subprocess.Popen(
        [*CLI, "deploy", str(hover_export), *common, "--no-live", "--duration", "120"],
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
        success_ref, length_ref = in_process(hover_export, EPISODES, SEED)
        sim_out, sim_err = sim.communicate(timeout=100)
    finally:
        sim.kill()
        node.terminate()
        node_out, _ = node.communicate(timeout=20)
    # An untrained policy falls out of the box within ~100 steps; this one must fly for real.
    assert length_ref >= 200, f"fixture policy survives only {length_ref:.0f} steps on average"
    assert sim.returncode == 0, sim_err + sim_out + node_out
    summary = json.loads(sim_out.strip().splitlines()[-1])
    assert summary["episodes"] == EPISODES and summary["missed_commands"] == 0
    assert abs(summary["success_rate"] - success_ref) <= 0.05 + 1e-9, (summary, success_ref)
    assert summary["mean_episode_steps"] == pytest.approx(length_ref, rel=0.05), (summary, length_ref)
    # The node flew every step: one answer per state, no bad data.
    status = node_out.strip().splitlines()[-1]
    assert "errors 0" in status, node_out
    out_count = int(status.split(" out ")[1].split()[0])
    assert out_count >= summary["steps"], status
