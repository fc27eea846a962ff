"""arm-push with its camera over real Cyclone DDS on loopback, two processes: `embodied
sim-robot arm-push` publishes joint states, tracked points and camera pictures and applies the
commands; `embodied deploy` runs an image policy on them on simulation time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from real_support import free_domain_id, write_robot_variant
from test_real_camera import CAMERA_INPUT, _export_image_policy

from embodied.real.robot_config import ROBOTS_DIR

CLI = [sys.executable, "-m", "embodied.cli"]


def fly_arm_push_over_dds(policy: str, robot: Path, sim_env: list[str]) -> str:
    """`embodied deploy POLICY` on simulation time against `embodied sim-robot arm-push` (one
    episode, ``--env`` overrides ``sim_env``), two processes over Cyclone DDS on loopback; checks
    the episode ran on the node's commands alone and returns the node's output."""
    common = ["--robot", str(robot), "--loopback", "--domain-id", str(free_domain_id())]
    node = subprocess.Popen(
        [*CLI, "deploy", policy, *common, "--no-live", "--duration", "120", "--use-sim-time"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sim = subprocess.run(
        [*CLI, "sim-robot", "arm-push", *common, "--episodes", "1", "--seed", "3", "--json", *sim_env],
        capture_output=True,
        text=True,
        timeout=300,
    )
    node.terminate()
    node_out, _ = node.communicate(timeout=30)
    assert sim.returncode == 0, sim.stderr + sim.stdout + node_out
    summary = json.loads(sim.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 1 and summary["steps"] >= 10, summary
    assert summary["missed_commands"] == 0 and summary["safe_commands"] == 0, (summary, node_out)
    return node_out


@pytest.mark.slow  # two processes start Cyclone DDS, the simulator renders every step
def test_image_policy_flies_arm_push_over_dds_in_lockstep(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    _export_image_policy(tmp_path / "export")
    robot = write_robot_variant(
        tmp_path,
        ROBOTS_DIR / "arm_push_sim.yaml",
        {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}},
    )
    camera = ["--env", "backend.camera=top", "--env", "backend.image_size_px=40"]
    node_out = fly_arm_push_over_dds(str(tmp_path / "export"), robot, camera)
    # No state change but arming and the end: sim-robot leaving, seen as its publishers going away.
    changes = [line for line in node_out.splitlines() if "embodied.real.node:" in line and " -> " in line]
    assert changes[:2] == [
        "INFO embodied.real.node: waiting -> rearming: inputs valid",
        "INFO embodied.real.node: rearming -> armed: inputs valid",
    ], node_out
    assert all("every publisher of" in line for line in changes[2:]), node_out
