"""The MuJoCo sim-to-sim check of tracking policies: its observation (read from policy_io.json) equals
quad-track's for the same state and moving setpoint, and episodes follow the run's reference path."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.sim.quadrotor import quat_to_rot
from embodied.tasks.quadrotor.track import QuadTrack, QuadTrackCfg
from embodied.verify.episodes import EpisodeRules, Reference, run_episodes
from embodied.verify.gates import DEFAULT_SWEEP
from embodied.verify.observation import ObservationLayout, state_terms

CPU = torch.device("cpu")


def test_mujoco_layout_equals_the_task_observation() -> None:
    # the physical observation, as the MuJoCo check builds it (the exported policy applies the yaw flip)
    cfg = QuadTrackCfg(path="mix", action_history=1, obs_noise_std=(0.0,) * 4, yaw_symmetry=False)
    env = QuadTrack(cfg, 8, CPU, seed=1)
    for _ in range(9):
        env.step(torch.full((8, 4), env.hover_action))
    spec = env.io_spec()
    layout = ObservationLayout(spec, "test")
    raw = {k: v.double().numpy() for k, v in env.physical_state().items()}
    terms = state_terms(
        raw["position_w"] - raw["setpoint_w"],
        quat_to_rot(torch.from_numpy(raw["quat_wb"])).numpy().reshape(8, 3, 3),
        raw["lin_vel_w"],
        raw["ang_vel_b"],
        raw["yaw_sp_rad"],
        raw["vel_sp_w"],
        raw["acc_sp_w"],
    )
    history = env.action_hist.double().numpy()
    obs = layout.assemble(terms, None, history, None)
    np.testing.assert_allclose(obs, env.observe(noise=False)["policy"].numpy(), atol=2e-6, rtol=0)


def test_reference_follows_the_run_paths_and_rms_decides_success() -> None:
    cfg = QuadTrackCfg(path="circle", circle_radius_m=0.4, period_s=4.0, episode_steps=150)
    spec = QuadTrack(cfg, 2, CPU, seed=0).io_spec()
    rules = EpisodeRules.from_spec(spec, "test")
    assert rules.episode_steps == 150 and rules.success_rms_m == cfg.success_rms_m
    ref = Reference(spec, rules, 3, seed=0, source="test")
    setpoint, vel, acc = ref.at(200, 3)  # two seconds: half a lap, the far side of the circle
    assert vel is not None and acc is not None
    radius = np.linalg.norm(setpoint - np.asarray(cfg.setpoint_w), axis=1)
    np.testing.assert_allclose(radius, 0.8, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vel, axis=1), 0.4 * 2 * np.pi / 4.0, rtol=1e-5)
    # A policy that holds hover thrust drifts off the moving setpoint: RMS well above the threshold.
    hover = float(spec.extra["hover_action"])
    result = run_episodes(lambda obs: np.full((obs.shape[0], 4), hover), spec, 4, seed=0, noise=False)
    assert result.success_rate == 0.0 and result.rms_error_m > cfg.success_rms_m


def test_verify_leaves_the_l2f_recovery_check_out_for_tracking_runs(
    trained_run: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """L2F's starts are hover starts: a tracking run is verified without them, and says so."""
    pytest.importorskip("mujoco")
    pytest.importorskip("onnxruntime")
    from embodied.cli import main
    from embodied.verify.report import check_verified

    trained = trained_run("quad-track", "ppo", 0, ["trainer.total_env_steps=2048", "num_envs=32"])
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns("export", "verify.*"))
    no_sweep = [f"--sweep={knob}=" for knob in DEFAULT_SWEEP]
    lenient = ["--gate=torch_success_min=0", "--gate=mujoco_success_min=0", "--gate=firmware_success_min=0"]
    quick = ["--episodes", "4", "--no-progress", "--threads", "1", "--no-plot"]
    assert main(["verify", str(run), *quick, *no_sweep, *lenient, "--gate=sim_to_sim_drop_max=1"]) == 0
    report = json.loads((run / "verify.json").read_text())
    assert set(report["success_rate"]) == {"torch", "mujoco", "firmware"}
    assert report["gates_not_applicable"] == ["l2f_recovery_min"] and "l2f_recovery_min" in report["gates"]
    assert "l2f_recovery_min" not in {g["name"] for g in report["gate_results"]}
    assert "n/a   l2f_recovery_min" in capsys.readouterr().out
    assert check_verified(run)["gates_passed"] is True
