"""The X quadrotor's 180° yaw symmetry: the simulator commutes with it, the task and the exported
policy (torch, ONNX, C) apply the same flip from one table, and the flip is idempotent."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from export_support import needs_gcc, random_policy, write_io

from embodied.crazyflie.firmware_build import build_host_library
from embodied.export.bundle import export_module
from embodied.export.c_header import generate_c
from embodied.export.host_lib import HostPolicyLib
from embodied.export.layers import mlp_arrays, with_io_symmetry
from embodied.export.onnx import export_onnx, probe_observations
from embodied.policies.mlp import ExportedPolicy
from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg, quat_multiply
from embodied.tasks.quadrotor.terms import MOTOR_FLIP, policy_terms, yaw_cost, yaw_cost_mod_pi, yaw_symmetry_tables

CPU = torch.device("cpu")
QUAT_Z_PI = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
"""Rotation by π about z: the relabelled body b' = b Rz(π)."""


def twin_env(yaw_symmetry: bool, n: int = 64) -> QuadHover:
    """Disturbance torques off (a body-frame torque would need its own flip); force and noise too."""
    cfg = QuadHoverCfg(
        obs_noise_std=(0.0, 0.0, 0.0, 0.0),
        disturbance_force_std_n=0.0,
        disturbance_torque_std_nm=0.0,
        yaw_symmetry=yaw_symmetry,
    )
    return QuadHover(cfg, n, CPU, seed=3)


def set_twins(env: QuadHover) -> torch.Tensor:
    """Envs 2k and 2k+1 become the same physical vehicle, the second labelled by b' = b Rz(π)
    (motors relabelled); returns the physical random actions ``[N, 4]`` of the first of each pair."""
    s = env.physical_state()
    even = torch.arange(0, env.num_envs, 2)
    quat = s["quat_wb"].clone()
    quat[even + 1] = quat_multiply(quat[even], QUAT_Z_PI.expand(len(even), 4))
    ang = s["ang_vel_b"].clone()
    ang[even + 1] = ang[even] * torch.tensor([-1.0, -1.0, 1.0])
    rpm = s["motor_rpm"].clone()
    rpm[even + 1] = rpm[even][:, list(MOTOR_FLIP)]
    position, lin_vel, yaw = (s[k].clone() for k in ("position_w", "lin_vel_w", "yaw_sp_rad"))
    for v in (position, lin_vel, yaw):
        v[even + 1] = v[even]
    env.set_physical_state(
        position_w=position, quat_wb=quat, lin_vel_w=lin_vel, ang_vel_b=ang, motor_rpm=rpm, yaw_sp_rad=yaw
    )
    return torch.rand(env.num_envs, 4, generator=torch.Generator().manual_seed(0)) * 1.2 - 0.6


def test_simulator_dynamics_commute_with_the_relabelling() -> None:
    env = twin_env(yaw_symmetry=False)
    actions = set_twins(env)
    even = torch.arange(0, env.num_envs, 2)
    actions[even + 1] = actions[even][:, list(MOTOR_FLIP)]  # each twin's motors get the same thrusts
    for _ in range(20):
        env.step(actions)
    s = env.physical_state()
    alive = env.episode_step[even] == 20
    assert int(alive.sum()) > 10
    e, o = even[alive], even[alive] + 1
    torch.testing.assert_close(s["position_w"][o], s["position_w"][e], atol=2e-5, rtol=0)
    torch.testing.assert_close(s["lin_vel_w"][o], s["lin_vel_w"][e], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        s["ang_vel_b"][o], s["ang_vel_b"][e] * torch.tensor([-1.0, -1.0, 1.0]), atol=1e-3, rtol=0
    )
    torch.testing.assert_close(s["motor_rpm"][o], s["motor_rpm"][e][:, list(MOTOR_FLIP)], atol=0.5, rtol=1e-5)
    want = quat_multiply(s["quat_wb"][e], QUAT_Z_PI.expand(len(e), 4))
    sign = torch.sign((want * s["quat_wb"][o]).sum(dim=1, keepdim=True))
    torch.testing.assert_close(s["quat_wb"][o], want * sign, atol=1e-5, rtol=0)
    # The same motors without the relabelling do not commute (the test can fail).
    env2 = twin_env(yaw_symmetry=False)
    actions2 = set_twins(env2)
    for _ in range(20):
        env2.step(actions2)
    gap = env2.physical_state()["ang_vel_b"][o] - env2.physical_state()["ang_vel_b"][e] * torch.tensor(
        [-1.0, -1.0, 1.0]
    )
    assert float(gap.abs().max()) > 0.1


def test_task_sees_twins_alike_and_relabels_the_action() -> None:
    """With the symmetry on, a state and its twin give the same canonical observation, and the
    same canonical action keeps them twins (the task relabels it for one of them)."""
    env = twin_env(yaw_symmetry=True)
    set_twins(env)
    first = env.observe(noise=False)["policy"]
    even = torch.arange(0, env.num_envs, 2)
    torch.testing.assert_close(first[even + 1], first[even], atol=1e-5, rtol=0)
    assert bool((first[:, 3] >= 0).all()), "canonical observations have R_hb[0][0] >= 0"
    assert bool(env.yaw_flip[even].squeeze(1).ne(env.yaw_flip[even + 1].squeeze(1)).any())
    gen = torch.Generator().manual_seed(1)
    for _ in range(10):
        canonical = torch.rand(env.num_envs, 4, generator=gen) * 1.2 - 0.6
        canonical[even + 1] = canonical[even]  # one policy, same input -> same output
        obs, reward, *_ = env.step(canonical)
    alive = env.episode_step[even] == 10
    e = even[alive]
    torch.testing.assert_close(obs["policy"][e + 1], obs["policy"][e], atol=5e-4, rtol=0)
    # The reward is symmetric too (heading error modulo 180°, action cost over all motors).
    torch.testing.assert_close(reward[e + 1], reward[e], atol=1e-4, rtol=0)
    # Physical action history differs by the relabelling where exactly one twin is flipped.
    hist = env.action_hist
    assert not torch.equal(hist[e + 1], hist[e])


def test_yaw_cost_mod_pi_is_the_smaller_of_the_two_labellings() -> None:
    yaw = torch.tensor([0.0, math.pi, math.pi / 2, -math.pi / 2, 0.3, math.pi - 0.3])
    c, s = torch.cos(yaw), torch.sin(yaw)
    zero, one = torch.zeros_like(yaw), torch.ones_like(yaw)
    rot = torch.stack((c, -s, zero, s, c, zero, zero, zero, one), dim=1)  # Rz(yaw), row-major
    cost = yaw_cost_mod_pi(rot.T)
    torch.testing.assert_close(cost, (1.0 - torch.cos(yaw).abs()) / 2.0, atol=1e-6, rtol=0)
    assert float(yaw_cost(rot.T)[1]) == pytest.approx(1.0) and float(cost[1]) == pytest.approx(0.0, abs=1e-6)
    flipped = rot * torch.tensor([-1.0, -1.0, 1.0] * 3)
    torch.testing.assert_close(yaw_cost_mod_pi(flipped.T), cost)
    torch.testing.assert_close(cost, torch.minimum(yaw_cost(rot.T), yaw_cost(flipped.T)))


def test_tables_follow_the_term_table() -> None:
    terms = policy_terms(integral=True, history=2)
    t = yaw_symmetry_tables(terms)
    assert t["select_index"] == 3 and t["action_source"] == [2, 3, 0, 1]
    assert len(t["obs_source"]) == len(t["obs_sign"]) == 18 + 3 + 8
    # rot_hb columns 0 and 1 negated, ang_vel_b x and y, history permuted per block of 4.
    assert t["obs_sign"][3:12] == [-1.0, -1.0, 1.0] * 3 and t["obs_sign"][15:18] == [-1.0, -1.0, 1.0]
    assert t["obs_sign"][:3] == t["obs_sign"][12:15] == t["obs_sign"][18:21] == [1.0] * 3
    assert t["obs_source"][21:] == [23, 24, 21, 22, 27, 28, 25, 26]
    # The flip is an involution: applying it twice is the identity.
    src, sign = np.array(t["obs_source"]), np.array(t["obs_sign"])
    x = np.random.default_rng(0).normal(size=(5, len(src)))
    np.testing.assert_array_equal((x[:, src] * sign)[:, src] * sign, x)


def test_io_spec_declares_the_symmetry_and_the_option_turns_it_off() -> None:
    on = twin_env(yaw_symmetry=True, n=4).io_spec().extra
    assert on["yaw_symmetry"]["select_index"] == 3
    off_env = twin_env(yaw_symmetry=False, n=256)
    assert "yaw_symmetry" not in off_env.io_spec().extra
    assert bool((off_env.observe(noise=False)["policy"][:, 3] < 0).any())  # physical: both halves


def sym_policy(seed: int = 0, history: int = 1) -> tuple[ExportedPolicy, ExportedPolicy, QuadHover]:
    env = QuadHover(dataclasses.replace(QuadHoverCfg(), action_history=history), 8, CPU, seed=seed)
    bare = random_policy(obs_dim=env.cfg.obs_dim, hidden=(32, 32), seed=seed)
    module = with_io_symmetry(bare, env.io_spec())
    assert isinstance(module, ExportedPolicy) and module.sym_select_index == 3
    return bare, module, env


def test_exported_flip_is_idempotent_on_canonical_and_relabels_physical() -> None:
    bare, module, env = sym_policy()
    obs = env.observe()["policy"]  # canonical
    with torch.no_grad():
        torch.testing.assert_close(module(obs), bare(obs), atol=0, rtol=0)
        twin = obs[:, module.sym_obs_source] * module.sym_obs_sign  # physical mirror image
        assert bool((twin[:, 3] < 0).all())
        torch.testing.assert_close(module(twin), bare(obs)[:, list(MOTOR_FLIP)], atol=0, rtol=0)
    assert with_io_symmetry(module, env.io_spec()) is module  # attaching twice keeps one flip


def test_bad_tables_are_named() -> None:
    bare, _, env = sym_policy()
    tables = dict(env.io_spec().extra["yaw_symmetry"])
    with pytest.raises(ValueError, match="action_source"):
        bare.with_symmetry({**tables, "action_source": [0, 0, 1, 2]})
    with pytest.raises(ValueError, match="obs_sign"):
        bare.with_symmetry({**tables, "obs_sign": [2.0] * len(tables["obs_sign"])})
    with pytest.raises(ValueError, match="select_index"):
        bare.with_symmetry({k: v for k, v in tables.items() if k != "select_index"})


def test_onnx_parity_covers_the_flipped_branch(tmp_path: Path) -> None:
    import onnxruntime as ort

    bare, module, env = sym_policy()
    probes = probe_observations(mlp_arrays(module), num=64)
    assert (probes[:, 3] < 0).any() and (probes[:, 3] >= 0).any()
    result = export_onnx(bare, env.io_spec(), tmp_path, env.observe()["policy"].numpy())
    assert result.max_abs_err <= 1e-5
    session = ort.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["action"], {"obs": probes})
    with torch.no_grad():
        want = module(torch.from_numpy(probes)).numpy()
        unflipped = bare(torch.from_numpy(probes)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.abs(got[probes[:, 3] < 0] - unflipped[probes[:, 3] < 0]).max() > 1e-3  # the flip is in the graph


@needs_gcc
def test_c_selftest_vector_is_flipped_and_matches_torch(tmp_path: Path) -> None:
    _, module, env = sym_policy(history=2)
    canonical = env.observe()["policy"].numpy()
    policy_io = write_io(module, env.io_spec(), tmp_path)
    out = generate_c(module, policy_io, tmp_path / "c", canonical[0])
    assert out.example_obs[3] < 0  # the embedded vector takes the flipped branch
    lib = HostPolicyLib(build_host_library(tmp_path / "c", tmp_path / "build"))
    ok, err = lib.selftest()
    assert ok and err <= 1e-5
    probes = probe_observations(mlp_arrays(module), num=64)
    with torch.no_grad():
        want = module(torch.from_numpy(probes)).numpy()
    np.testing.assert_allclose(lib.policy_step(probes, 4), want, atol=1e-5, rtol=0)


@needs_gcc
def test_export_module_carries_the_task_symmetry(tmp_path: Path) -> None:
    bare, module, env = sym_policy()
    report = export_module(bare, env.io_spec(), tmp_path, "all", env.observe()["policy"].numpy())
    assert report.onnx_max_abs_err is not None and report.c_max_abs_err is not None
    assert report.c_max_abs_err <= 1e-5
    assert "policy_sym_obs_source" in (tmp_path / "c" / "policy.c").read_text()
    from embodied.export.policy_io import weights_sha256

    assert report.model_sha256 == weights_sha256(module) != weights_sha256(bare)


def robust_preset_layout() -> dict[str, object]:
    """The observation options of ``--preset robust`` (integral, action history)."""
    from embodied.commands.train import preset_file
    from embodied.experiment import resolve_experiment

    env = resolve_experiment("quad-hover", "ppo", preset_file("quad-hover", "ppo", "robust")).env
    assert env.pos_err_integral and env.action_history > 1  # what this layout is meant to cover
    return {"pos_err_integral": env.pos_err_integral, "action_history": env.action_history}


@needs_gcc
@pytest.mark.parametrize("layout", [{"action_history": 2}, "robust"], ids=["history2", "robust_preset"])
def test_firmware_controller_on_physical_state_equals_the_task_policy(
    tmp_path: Path, layout: dict[str, object] | str
) -> None:
    """quad_ctrl.c builds the physical observation from the raw state and runs the exported C
    policy (flip inside); its motor commands equal the task's: the bare network on the task's
    canonical observation, relabelled back where the task flipped. Closed loop, physical actions.
    The robust preset's layout adds the position-error integral and four previous actions."""
    from embodied.crazyflie.sil import packed_state
    from embodied.tasks.quadrotor.terms import yaw_flip_action

    n = 32
    options = robust_preset_layout() if layout == "robust" else layout
    assert isinstance(options, dict)
    cfg = QuadHoverCfg(obs_noise_std=(0.0,) * 4, episode_steps=30, **options)  # type: ignore[arg-type]
    env = QuadHover(cfg, n, CPU, seed=5)
    env.physical_actions = True
    spec = env.io_spec()
    bare = random_policy(obs_dim=spec.obs_dim, hidden=(32, 32), seed=2)
    with torch.no_grad():  # near hover, so it flies instead of tumbling
        last = [m for m in bare.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.weight.mul_(0.05)
        last.bias.fill_(env.hover_action)
    module = with_io_symmetry(bare, spec)
    generate_c(module, write_io(module, spec, tmp_path), tmp_path / "c")
    lib = HostPolicyLib(build_host_library(tmp_path / "c", tmp_path / "build"))
    ctxs = lib.new_contexts(n, initial_action=env.hover_action)
    obs = env.observe(noise=False)["policy"]
    flipped_seen = 0
    for _ in range(40):
        lib.reset(ctxs, (env.episode_step == 0).numpy(), env.hover_action)
        states, setpoints = packed_state(env)
        actions = lib.step(ctxs, states, setpoints)
        with torch.no_grad():
            want = yaw_flip_action(bare(obs), env.yaw_flip).numpy()
        np.testing.assert_allclose(actions, want, atol=1e-5, rtol=0)
        flipped_seen += int(env.yaw_flip.sum())
        obs = env.step(torch.from_numpy(actions))[0]["policy"]
    assert flipped_seen > 100
