"""Firmware: QEMU STM32F405 self-test + instruction count, Crazyflie app (shim), observation assembly in C."""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import generic_io_spec, needs_arm, needs_gcc, needs_qemu, quad_io_spec, random_policy, write_io

from embodied.crazyflie import firmware_build as fb
from embodied.errors import EmbodiedError
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib
from embodied.policies.mlp import ExportedPolicy
from embodied.sim.quadrotor import quat_to_rot
from embodied.tasks.quadrotor.terms import heading_cos_sin, rot_wb_to_hb, vec_w_to_h

HISTORY = 32


def _quad_c(out: Path, module: ExportedPolicy, history: int = HISTORY) -> Path:
    io_path = write_io(module, quad_io_spec(history=history), out)
    generate_c(module, io_path, out / "c")
    return out / "c"


@pytest.fixture(scope="module")
def quad(tmp_path_factory: pytest.TempPathFactory) -> tuple[ExportedPolicy, Path]:
    out = tmp_path_factory.mktemp("fw")
    module = random_policy()
    return module, _quad_c(out, module)


def _random_states(n: int, seed: int) -> np.ndarray:
    """Packed raw states [n, 13] within the physical ranges the simulator produces."""
    rng = np.random.default_rng(seed)
    quat = rng.normal(size=(n, 4))
    quat /= np.linalg.norm(quat, axis=1, keepdims=True)
    pos = rng.uniform(-1.0, 1.0, size=(n, 3))
    vel = rng.uniform(-3.0, 3.0, size=(n, 3))
    ang = rng.uniform(-10.0, 10.0, size=(n, 3))
    return np.concatenate([pos, quat, vel, ang], axis=1).astype(np.float32)


def _python_obs(states: np.ndarray, setpoints: np.ndarray, history: np.ndarray) -> np.ndarray:
    """The quad-hover observation of docs/conventions.md (heading frame of the setpoint yaw,
    ``setpoints [n, 4]`` = x, y, z, yaw), computed with the simulator's own helpers."""
    s, sp = torch.from_numpy(states), torch.from_numpy(setpoints)
    heading = heading_cos_sin(sp[:, 3])
    rot = rot_wb_to_hb(quat_to_rot(s[:, 3:7]), heading)
    pos_err = vec_w_to_h(s[:, 0:3] - sp[:, 0:3], heading)
    vel = vec_w_to_h(s[:, 7:10], heading)
    return torch.cat([pos_err, rot, vel, s[:, 10:13], torch.from_numpy(history)], dim=1).numpy()


@needs_qemu
def test_qemu_selftest_and_instructions_per_mac(quad: tuple[ExportedPolicy, Path], tmp_path: Path) -> None:
    _, c_out = quad
    report = fb.run_qemu(fb.build_qemu_elf(c_out, tmp_path))
    assert report.selftest_passed
    assert report.selftest_max_err <= 1e-5
    assert report.num_macs == 146 * 64 + 64 * 64 + 64 * 4
    # Each MAC needs at least its FMA plus a share of a load, and the target is <= 2.5.
    assert 1.0 < report.instructions_per_mac <= 2.5
    assert report.instructions_per_control_step is not None
    assert report.instructions_per_control_step > report.instructions_per_forward


@needs_qemu
def test_qemu_reports_a_failing_selftest(tmp_path: Path) -> None:
    module = random_policy(obs_dim=6, hidden=(8,), action_dim=2)
    io_path = write_io(module, generic_io_spec(6, 2), tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    src = tmp_path / "c" / "policy.c"
    text = src.read_text()
    # Corrupt the first bias so the network no longer matches the embedded expected output.
    head, _, tail = text.partition("static const float policy_b0[8] = {\n    ")
    src.write_text(head + "static const float policy_b0[8] = {\n    4.0f + " + tail)
    report = fb.run_qemu(fb.build_qemu_elf(tmp_path / "c", tmp_path / "q"))
    assert not report.selftest_passed
    assert report.exit_code == 1


@needs_arm
def test_crazyflie_app_compiles_against_shim(quad: tuple[ExportedPolicy, Path], tmp_path: Path) -> None:
    _, c_out = quad
    staged = fb.stage_crazyflie_app(c_out, tmp_path / "app")
    for name in ("Makefile", "Kbuild", "app-config", "src/Kbuild", "src/policy.h", "src/quad_ctrl.c"):
        assert (staged / name).is_file(), name
    assert "OOT_CONFIG := $(PWD)/app-config" in (staged / "Makefile").read_text()
    assert "CONFIG_CONTROLLER_OOT=y" in (staged / "app-config").read_text()
    obj, fp = fb.build_crazyflie_shim(staged, tmp_path / "build")
    assert obj.is_file()
    assert fp.flash_bytes > 13696 * 4  # the weights alone
    assert fp.ram_bytes < 4096  # static activations, observation, history: no large buffers


def test_stage_refuses_a_non_quad_policy(tmp_path: Path) -> None:
    module = random_policy(obs_dim=6, hidden=(8,), action_dim=2)
    io_path = write_io(module, generic_io_spec(6, 2), tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    with pytest.raises(EmbodiedError, match="quadrotor policies only"):
        fb.stage_crazyflie_app(tmp_path / "c", tmp_path / "app")


@needs_gcc
def test_c_observation_equals_python_observation(quad: tuple[ExportedPolicy, Path], tmp_path: Path) -> None:
    module, c_out = quad
    lib = HostPolicyLib(fb.build_host_library(c_out, tmp_path))
    n = 64
    ctxs = lib.new_contexts(n, initial_action=0.25)
    rng = np.random.default_rng(1)
    setpoints = np.concatenate(
        [rng.uniform(-0.5, 0.5, size=(n, 3)), rng.uniform(-np.pi, np.pi, size=(n, 1))], axis=1
    ).astype(np.float32)
    history = np.full((n, 4 * HISTORY), 0.25, dtype=np.float32)
    for step in range(3):
        states = _random_states(n, seed=step)
        obs, clamped = lib.assemble_obs(ctxs, states, setpoints)
        assert clamped == 0
        np.testing.assert_allclose(obs, _python_obs(states, setpoints, history), atol=2e-7, rtol=0)
        actions = lib.step(ctxs, states, setpoints)
        # The full controller step is the network on exactly that observation.
        np.testing.assert_allclose(actions, module(torch.from_numpy(obs)).numpy(), atol=1e-5, rtol=0)
        history = np.concatenate([actions, history[:, :-4]], axis=1)  # newest first


@needs_gcc
def test_non_finite_and_out_of_range_inputs_are_clamped(quad: tuple[ExportedPolicy, Path], tmp_path: Path) -> None:
    _, c_out = quad
    lib = HostPolicyLib(fb.build_host_library(c_out, tmp_path))
    ctxs = lib.new_contexts(3, initial_action=0.0)
    states = _random_states(3, seed=4)
    states[0, 0] = np.nan  # position x
    states[0, 8] = np.inf  # velocity y
    states[1, 10] = 1e4  # roll rate far beyond the gyro range
    states[2, 3:7] = 0.0  # no attitude at all
    obs, clamped = lib.assemble_obs(ctxs, states, np.zeros((3, 4), dtype=np.float32))
    assert np.all(np.isfinite(obs))
    assert clamped == 4  # NaN, inf, one range clamp, and the zero quaternion replaced by level once
    assert obs[0, 0] == 0.0 and obs[0, 13] == 0.0
    assert obs[1, 15] == pytest.approx(35.0)
    np.testing.assert_array_equal(obs[2, 3:12], np.eye(3, dtype=np.float32).reshape(-1))
    actions = lib.step(ctxs, states, np.zeros((3, 4), dtype=np.float32))
    assert np.all(np.isfinite(actions)) and np.all(np.abs(actions) <= 1.0)


def _fake_tree(root: Path, force_body: str, version_tag: str | None = None) -> Path:
    """A directory shaped like a crazyflie-firmware checkout (only the files the check reads)."""
    (root / "tools" / "make").mkdir(parents=True)
    (root / "tools" / "make" / "oot.mk").write_text("# oot\n")
    iface = root / "src" / "modules" / "interface" / "controller"
    iface.mkdir(parents=True)
    (iface / "controller.h").write_text(
        "void controllerOutOfTree(control_t *c, const setpoint_t *s, const sensorData_t *d, const state_t *t, "
        "const stabilizerStep_t stabilizerStep);\n"
    )
    (root / "src" / "modules" / "src").mkdir(parents=True)
    (root / "src" / "modules" / "src" / "power_distribution_quadrotor.c").write_text(
        "static void powerDistributionForce(const control_t *control, motors_thrust_uncapped_t* m) {\n"
        f"  {force_body}\n}}\n"
    )
    (root / "src" / "drivers" / "src").mkdir(parents=True)
    (root / "src" / "drivers" / "src" / "motors.c").write_text(
        "float motorsCompensateBatteryVoltage(uint32_t id, float iThrust, float supplyVoltage)\n{\n"
        "  #ifdef CONFIG_ENABLE_THRUST_BAT_COMPENSATED\n  float thrust = (iThrust / 65535.0f) * THRUST_MAX;\n"
        "  #endif\n  return iThrust;\n}\n"
    )
    (root / "vendor" / "FreeRTOS").mkdir(parents=True)
    (root / "vendor" / "FreeRTOS" / "tasks.c").write_text("\n")
    if version_tag is not None:
        import subprocess

        git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "tree"], check=True)
        subprocess.run([*git, "tag", version_tag], check=True)
    return root


def test_crazyflie_tree_validation(tmp_path: Path) -> None:
    with pytest.raises(EmbodiedError, match="not a directory"):
        fb.check_crazyflie_tree(tmp_path / "missing")
    with pytest.raises(EmbodiedError, match=r"oot\.mk.*2025\.12 or newer"):
        fb.check_crazyflie_tree(tmp_path)
    implemented = "for (int i = 0; i < 4; i++) { m->list[i] = control->normalizedForces[i] * UINT16_MAX; }"
    assert fb.check_crazyflie_tree(_fake_tree(tmp_path / "new", implemented)) == "unknown version"


def test_crazyflie_tree_without_force_mode_is_refused_naming_the_version(tmp_path: Path) -> None:
    stub = _fake_tree(tmp_path / "old", "// Not implemented yet", version_tag="2025.09")
    with pytest.raises(EmbodiedError) as err:
        fb.check_crazyflie_tree(stub)
    text = str(err.value)
    assert "crazyflie-firmware 2025.09" in text  # the version found
    assert "controlModeForce is not implemented" in text  # why
    assert "2025.12 or newer" in text and "2026.08" in text  # what is accepted


def test_crazyflie_tree_older_by_its_tag_is_refused(tmp_path: Path) -> None:
    implemented = "m->list[0] = control->normalizedForces[0];"
    with pytest.raises(EmbodiedError, match=r"2025\.06\).*too old.*2025\.12"):
        fb.check_crazyflie_tree(_fake_tree(tmp_path / "t", implemented, version_tag="2025.06"))


@needs_gcc
def test_c_observation_equals_the_quad_hover_task(tmp_path: Path) -> None:
    """Same raw states in the task and in the firmware's C: identical policy observations
    (heading frame of every env's own setpoint yaw)."""
    from embodied.crazyflie.sil import packed_state
    from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

    cfg = QuadHoverCfg(action_history=3, yaw_symmetry=False)
    env = QuadHover(cfg, num_envs=32, device=torch.device("cpu"), seed=0)
    spec = env.io_spec()
    module = random_policy(obs_dim=spec.obs_dim)
    io_path = write_io(module, spec, tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    lib = HostPolicyLib(fb.build_host_library(tmp_path / "c", tmp_path / "build"))
    hover = float(spec.extra["hover_action"])
    ctxs = lib.new_contexts(32, initial_action=hover)
    for step in range(3):
        states = _random_states(32, seed=10 + step)
        # Inside the 0.6 m box along every heading-frame axis (the errors rotate with the yaw).
        states[:, 0:3] = states[:, 0:3] * 0.35 + np.array(cfg.setpoint_w, dtype=np.float32)
        obs_task = env.set_physical_state(
            position_w=torch.from_numpy(states[:, 0:3]),
            quat_wb=torch.from_numpy(states[:, 3:7]),
            lin_vel_w=torch.from_numpy(states[:, 7:10]),
            ang_vel_b=torch.from_numpy(states[:, 10:13]),
        )["policy"].numpy()
        packed, setpoints = packed_state(env)  # setpoints [32, 4]: position and each env's yaw
        obs_c, clamped = lib.assemble_obs(ctxs, packed, setpoints)
        assert clamped == 0
        np.testing.assert_allclose(obs_c, obs_task, atol=3e-7, rtol=0)
        # Step both with the same actions so the action histories must evolve identically.
        actions = lib.step(ctxs, packed, setpoints)
        env.step(torch.from_numpy(actions))


@needs_gcc
def test_c_pos_err_integral_equals_the_task_in_closed_loop(tmp_path: Path) -> None:
    """With ``pos_err_integral`` the firmware integrates the position error itself: over a
    rollout flown by the C controller (episodes end and restart), every observation it feeds
    the network equals the task's, the integral bit for bit."""
    from embodied.crazyflie.sil import packed_state
    from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg

    n = 16
    # Short episodes so that restarts (and the firmware's resets) are part of the comparison.
    cfg = QuadHoverCfg(
        pos_err_integral=True, action_history=2, obs_noise_std=(0.0,) * 4, episode_steps=30, yaw_symmetry=False
    )
    env = QuadHover(cfg, num_envs=n, device=torch.device("cpu"), seed=0)
    spec = env.io_spec()
    hover = float(spec.extra["hover_action"])
    module = random_policy(obs_dim=spec.obs_dim, seed=4)
    with torch.no_grad():  # a random policy near hover: it flies, it does not spin up past the gyro range
        last = [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(0.02)
        last.bias.fill_(hover)
    io_path = write_io(module, spec, tmp_path)
    generate_c(module, io_path, tmp_path / "c")
    lib = HostPolicyLib(fb.build_host_library(tmp_path / "c", tmp_path / "build"))
    ctxs = lib.new_contexts(n, initial_action=hover)
    obs_task = env.observe(noise=False)["policy"].numpy()
    ended, peak_integral = 0, 0.0
    for _ in range(80):
        fresh = (env.episode_step == 0).numpy()
        lib.reset(ctxs, fresh, hover)
        states, setpoints = packed_state(env)
        actions = lib.step(ctxs, states, setpoints)
        # The network's output on the task's observation: equal only if the C controller fed it
        # the same integral and history. Re-assembling after the step shows the state parts and
        # the integral the step used (its history has already advanced).
        np.testing.assert_allclose(actions, module(torch.from_numpy(obs_task)).numpy(), atol=1e-5, rtol=0)
        obs_c, clamped = lib.assemble_obs(ctxs, states, setpoints)
        assert clamped == 0
        np.testing.assert_array_equal(obs_c[:, 18:21], obs_task[:, 18:21])
        np.testing.assert_allclose(obs_c[:, :21], obs_task[:, :21], atol=3e-7, rtol=0)
        obs, _, terminated, truncated, _ = env.step(torch.from_numpy(actions))
        obs_task = obs["policy"].numpy()
        ended += int((terminated | truncated).sum())
        peak_integral = max(peak_integral, float(np.abs(obs_task[:, 18:21]).max()))
    assert ended > 0 and peak_integral > 0.01  # resets and a sizeable integral were both compared


@needs_qemu
def test_qemu_and_crazyflie_app_with_pos_err_integral(tmp_path: Path) -> None:
    module = random_policy(obs_dim=149, seed=5)
    io_path = write_io(module, quad_io_spec(history=HISTORY, pos_err_integral=True), tmp_path)
    c_out = tmp_path / "c"
    generate_c(module, io_path, c_out)
    report = fb.run_qemu(fb.build_qemu_elf(c_out, tmp_path / "qemu"))
    assert report.selftest_passed and report.instructions_per_control_step is not None
    obj, _ = fb.build_crazyflie_shim(fb.stage_crazyflie_app(c_out, tmp_path / "app"), tmp_path / "build")
    assert obj.is_file()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (briefly trained) quad-hover PPO run directory."""
    from embodied.experiment import replace_trainer, resolve_experiment
    from embodied.training.trainer import Trainer

    cfg = resolve_experiment("quad-hover", "ppo", None, ["trainer.total_env_steps=4096"], seed=0, num_envs=64)
    cfg = replace_trainer(cfg, progress=False, tensorboard=False, eval_every_env_steps=0, eval_episodes=16)
    run_dir = tmp_path_factory.mktemp("runs") / "quad"
    run_dir.mkdir()
    Trainer(cfg, run_dir, resume=False).train()
    return run_dir


@needs_gcc
def test_run_export_and_software_in_the_loop_matches_torch(tiny_run: Path) -> None:
    from embodied.training.evaluate import evaluate, load_policy
    from embodied.training.run import load_run
    from embodied.training.run_policy import export_run

    report = export_run(tiny_run, "all")
    assert report.onnx_max_abs_err is not None and report.onnx_max_abs_err <= 1e-5
    assert report.c_max_abs_err is not None and report.c_max_abs_err <= 1e-5
    run = load_run(tiny_run)
    results = {
        kind: evaluate(functools.partial(load_policy, kind, tiny_run), run.make_env, episodes=64, seed=3)
        for kind in ("torch", "onnx", "c")
    }
    assert results["torch"].mean_episode_length > 20  # a policy that flies a while, so the comparison means something
    torch_r, onnx_r, c_r = results["torch"], results["onnx"], results["c"]
    assert onnx_r.mean_return == pytest.approx(torch_r.mean_return, rel=1e-4)
    # The C controller builds its own (noise-free) observation from the raw state: close, not equal.
    assert c_r.mean_return == pytest.approx(torch_r.mean_return, rel=0.03)
    assert c_r.mean_episode_length == pytest.approx(torch_r.mean_episode_length, rel=0.03)
    assert abs(c_r.success_rate - torch_r.success_rate) <= 0.05


@needs_qemu
def test_firmware_commands_on_a_run(tiny_run: Path, capsys: pytest.CaptureFixture[str]) -> None:

    from embodied.commands import firmware
    from embodied.crazyflie.vehicle import flies_thrust
    from embodied.policy_io import read_policy_io

    assert firmware.run_emulate(argparse.Namespace(run_dir=tiny_run, json=True)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["selftest_passed"] is True
    assert out["instructions_per_forward"] > 0 and out["instructions_per_mac"] > 1.0
    build = argparse.Namespace(run_dir=tiny_run, crazyflie_base=None)
    if not flies_thrust(read_policy_io(tiny_run / "export")):
        # A task still exporting the rpm action (before the command chain of docs/conventions.md): refused with the reason.
        with pytest.raises(EmbodiedError, match="no motor_thrust action"):
            firmware.run_build(build)
        return
    assert firmware.run_build(build) == 0
    assert "app footprint: flash" in capsys.readouterr().out
