"""The fused quad-hover step (``tasks/quadrotor/hover_fused.py``) against the eager step, and its
counter-based observation noise (``sim/counter_normal.py``).

The logic is checked eagerly (``fused_step`` run without compiling it, fast); the compiled
function against its eager run is the slow test at the end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from embodied.config import apply_overrides
from embodied.sim.counter_normal import GOLDEN, MIX, UNIFORM_SCALE, counter_normal, stream_key
from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg
from embodied.tasks.quadrotor.hover_fused import CompiledFusedStep, fused_step

CPU = torch.device("cpu")


def _pair(cfg: QuadHoverCfg, n: int, seed: int) -> tuple[QuadHover, QuadHover]:
    """(eager env, same env stepping through the uncompiled fused step)."""
    eager = QuadHover(cfg, n, CPU, seed=seed)
    fused = QuadHover(cfg, n, CPU, seed=seed)
    fused._fused = fused_step
    return eager, fused


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    assert torch.allclose(a, b, atol=2e-5, rtol=1e-5), f"{what}: max diff {(a - b).abs().max().item()}"


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"pos_err_integral": True, "action_history": 2, "pos_bonus_weight": 1.0, "termination_penalty": 3.0},
        {"yaw_symmetry": False, "sim": {"randomization": {"mass_scale": [0.8, 1.2], "motor_tau_scale": [0.8, 1.5]}}},
        {
            "pos_err_integral": True,
            "action_history": 3,
            "gaps": {
                "obs_delay_steps": [0, 2],
                "motor_delay_steps": [0, 1],
                "thrust_mismatch": [0.9, 1.1],
                "battery_sag": [0.0, 0.3],
                "pos_bias_std_m": 0.02,
                "gyro_bias_std_rad_s": 0.05,
            },
            "sim": {"randomization": {"mass_scale": [0.7, 1.3]}},
        },
    ],
    ids=["default", "integral-history-bonus", "randomized-no-symmetry", "gap-models"],
)
def test_fused_step_matches_the_eager_step_through_resets(overrides: dict) -> None:
    """Without observation noise (the two steps draw it from different generators) the fused
    step gives the eager step's observations, rewards, flags, final observations and state,
    through many resets: random actions end most episodes within a few dozen steps."""
    cfg = apply_overrides(QuadHoverCfg(), {"obs_noise_std": [0.0] * 4, **overrides}, "test")
    eager, fused = _pair(cfg, 48, seed=5)
    gen = torch.Generator().manual_seed(1)
    ended = 0
    for step in range(120):
        # Mostly near hover, sometimes wild: both ways of ending an episode happen.
        scale = 1.0 if step % 7 == 0 else 0.3
        action = (torch.rand(48, 4, generator=gen) * 2 - 1) * scale + eager.hover_action
        o1, r1, te1, tr1, i1 = eager.step(action)
        o2, r2, te2, tr2, i2 = fused.step(action)
        assert torch.equal(te1, te2) and torch.equal(tr1, tr2), f"step {step}"
        _close(r1, r2, f"reward at step {step}")
        for group in ("policy", "critic"):
            _close(o1[group], o2[group], f"{group} at step {step}")
            _close(i1["final_obs"][group], i2["final_obs"][group], f"final {group} at step {step}")
        assert torch.equal(i1["success"], i2["success"])
        assert i1["reward_terms"].keys() == i2["reward_terms"].keys()
        ended += int((te1 | tr1).sum())
    assert ended > 48, "the comparison must cross many resets"
    _close(eager.sim.state, fused.sim.state, "final state")
    _close(eager.sim.param_scales, fused.sim.param_scales, "parameter scales")
    assert torch.equal(eager.episode_step, fused.episode_step)
    assert torch.equal(eager.yaw_flip, fused.yaw_flip)
    _close(eager.heading, fused.heading, "heading")
    if eager.gaps is not None:  # the gap models' state: delays, draws and both buffers
        assert fused.gaps is not None
        for name, value in eager.gaps.state_dict().items():
            _close(value.float(), getattr(fused.gaps, name).float(), f"gap state {name}")


def test_fused_step_truncates_with_success_like_the_eager_step() -> None:
    """Full-length episodes at the setpoint end truncated and successful in both steps."""
    cfg = apply_overrides(QuadHoverCfg(), {"obs_noise_std": [0.0] * 4, "episode_steps": 5}, "test")
    eager, fused = _pair(cfg, 8, seed=0)
    for env in (eager, fused):
        env.set_physical_state(
            position_w=[0.0, 0.0, 1.0], quat_wb=[1.0, 0, 0, 0], lin_vel_w=[0.0] * 3, ang_vel_b=[0.0] * 3, yaw_sp_rad=0.0
        )
    hover = torch.full((8, 4), eager.hover_action)
    for _ in range(5):
        out_eager, out_fused = eager.step(hover), fused.step(hover)
    assert out_fused[3].all() and out_fused[4]["success"].all()
    assert torch.equal(out_eager[4]["success"], out_fused[4]["success"])


def test_fused_step_zeroes_a_diverged_env_like_the_eager_step() -> None:
    """A NaN state terminates its env and leaves a finite final observation and reward. (How far
    the NaN spreads differs: the eager step's packed products multiply it by zero coefficients,
    the row-wise step skips those, so only the other envs are compared.)"""
    cfg = apply_overrides(QuadHoverCfg(), {"obs_noise_std": [0.0] * 4}, "test")
    eager, fused = _pair(cfg, 4, seed=2)
    for env in (eager, fused):
        env.set_physical_state([1], lin_vel_w=[math.nan, 0.0, 0.0])
    hover = torch.full((4, 4), eager.hover_action)
    (_, r1, te1, _, i1), (_, r2, te2, _, i2) = eager.step(hover), fused.step(hover)
    assert te2.tolist() == [False, True, False, False] and torch.equal(te1, te2)
    assert torch.isfinite(i2["final_obs"]["policy"]).all() and torch.isfinite(i2["final_obs"]["critic"]).all()
    assert torch.isfinite(r2).all() and all(torch.isfinite(term).all() for term in i2["reward_terms"].values())
    kept = torch.tensor([True, False, True, True])
    _close(r1[kept], r2[kept], "reward")
    _close(i1["final_obs"]["critic"][kept], i2["final_obs"]["critic"][kept], "final critic")


@pytest.mark.parametrize(
    ("overrides", "pos_std_m"),
    [
        ({}, QuadHoverCfg().obs_noise_std[0]),
        ({"obs_noise_std": [0.0] * 4, "yaw_symmetry": False, "gaps": {"pos_noise_std_m": 0.04}}, 0.04),
    ],
    ids=["observation-noise", "gap-model-noise"],
)
def test_fused_noise_has_the_configured_spread_and_resumes_exactly(overrides: dict, pos_std_m: float) -> None:
    """With noise the fused step's policy observation differs from the clean critic state by
    N(0, σ) per entry (the observation noise, or the gap models' estimator noise from the
    stream's rows after it); a checkpoint taken mid-run continues with the same noise."""
    env = QuadHover(apply_overrides(QuadHoverCfg(), overrides, "test"), 256, CPU, seed=4)
    env._fused = fused_step
    hover = torch.full((256, 4), env.hover_action)
    diffs = []
    for _ in range(20):
        obs, *_ = env.step(hover)
        # pos_err_h (3) does not change under the yaw relabelling: policy - critic is the noise.
        diffs.append(obs["policy"][:, 0:3] - obs["critic"][:, 0:3])
    eps = torch.cat(diffs)
    assert eps.std().item() == pytest.approx(pos_std_m, rel=0.1)
    assert abs(eps.mean().item()) < 3 * pos_std_m / math.sqrt(eps.numel())
    if "gaps" in overrides:  # the gap models' position noise alone: the rest of the state is clean
        assert torch.equal(obs["policy"][:, 3:18], obs["critic"][:, 3:18])
    state = env.state_dict()
    first = [env.step(hover)[0]["policy"] for _ in range(3)]
    env.load_state_dict(state)
    again = [env.step(hover)[0]["policy"] for _ in range(3)]
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_counter_normal_is_standard_normal_and_independent_across_counters_and_keys() -> None:
    key = torch.tensor(stream_key(7))
    draws = torch.stack([counter_normal(torch.tensor(c), key, 64, 129) for c in range(40)])
    assert draws.shape == (40, 64, 129)
    flat = draws.flatten()
    assert abs(flat.mean().item()) < 0.01 and flat.std().item() == pytest.approx(1.0, abs=0.01)
    # Tails of a normal: P(|z| > 3) = 0.0027.
    assert (flat.abs() > 3).float().mean().item() == pytest.approx(0.0027, rel=0.2)
    # Consecutive steps and different streams are uncorrelated; the same inputs repeat.
    assert abs(torch.corrcoef(torch.stack((draws[:-1].flatten(), draws[1:].flatten())))[0, 1].item()) < 0.01
    other = counter_normal(torch.tensor(3), torch.tensor(stream_key(8)), 64, 129)
    assert abs(torch.corrcoef(torch.stack((other.flatten(), draws[3].flatten())))[0, 1].item()) < 0.03
    assert torch.equal(counter_normal(torch.tensor(3), key, 64, 129), draws[3])
    assert stream_key(7) != stream_key(8) and 0 <= stream_key(-1) < 2**32


def _counter_normal_int64(counter: int, key: int, rows: int, cols: int) -> torch.Tensor:
    """``counter_normal`` with every word mixed on int64 (values below 2**32, masked)."""
    mask = 0xFFFFFFFF

    def mix(x: torch.Tensor) -> torch.Tensor:
        x = ((x >> 16) ^ x) * MIX & mask
        x = ((x >> 16) ^ x) * MIX & mask
        return (x >> 16) ^ x

    pairs = (cols + 1) // 2
    index = torch.arange(rows * pairs, dtype=torch.int64).view(rows, pairs)
    step = mix(torch.tensor((counter * GOLDEN + key) & mask))
    salt = mix(step ^ 0x5BD1E995)
    word_a = mix(((2 * index + step) & mask) ^ salt)
    word_b = mix(((2 * index + 1 + step) & mask) ^ salt)
    radius = torch.sqrt(-2.0 * torch.log(((word_a >> 8).to(torch.float32) + 0.5) * UNIFORM_SCALE))
    angle = (2.0 * math.pi) * ((word_b >> 8).to(torch.float32) * UNIFORM_SCALE)
    return torch.cat((radius * torch.cos(angle), radius * torch.sin(angle)), dim=1)[:, :cols]


@pytest.mark.parametrize(
    ("counter", "key", "rows", "cols"), [(0, 7, 18, 4096), (2**31 - 1, 2**32 - 1, 18, 37), (5, 0, 3, 1)]
)
def test_counter_normal_mixes_on_int32_to_the_int64_numbers(counter: int, key: int, rows: int, cols: int) -> None:
    """The per-element words are mixed on int32 (half the vector width of int64); wrapping
    products and masked shifts give exactly the numbers of the int64 mix, edge counters and
    keys included."""
    drawn = counter_normal(torch.tensor(counter), torch.tensor(key), rows, cols)
    assert torch.equal(drawn, _counter_normal_int64(counter, key, rows, cols))


@pytest.mark.slow
@pytest.mark.parametrize(
    "gaps",
    [{}, {"obs_delay_steps": [0, 2], "thrust_mismatch": [0.9, 1.1], "gyro_noise_std_rad_s": 0.05}],
    ids=["nominal", "gap-models"],
)
def test_compiled_fused_step_matches_its_eager_run_and_loads_from_its_cache(tmp_path: Path, gaps: dict) -> None:
    """The compiled step (``sim.compile``) against the same function run eagerly, noise on; a
    second process (a fresh compiler on the same cache folder) loads the saved step instead of
    compiling, and it steps the same."""
    cfg = apply_overrides(QuadHoverCfg(pos_err_integral=True), {"sim": {"compile": True}, "gaps": gaps}, "test")
    compiled = QuadHover(cfg, 64, CPU, seed=3)
    assert compiled._fused is not None and compiled._fused is not fused_step
    compiled._fused = CompiledFusedStep("cpu", tmp_path)
    eager = QuadHover(cfg, 64, CPU, seed=3)
    eager._fused = fused_step
    gen = torch.Generator().manual_seed(0)
    for step in range(40):
        action = torch.rand(64, 4, generator=gen) * 2 - 1
        o1, r1, te1, tr1, _ = eager.step(action)
        o2, r2, te2, tr2, _ = compiled.step(action)
        assert torch.equal(te1, te2) and torch.equal(tr1, tr2), f"step {step}"
        assert torch.allclose(r1, r2, atol=1e-4) and torch.allclose(o1["policy"], o2["policy"], atol=1e-4)
        assert torch.allclose(o1["critic"], o2["critic"], atol=1e-4)
    assert compiled.sim.state.stride() == (1, 64), "the step keeps the simulator's column-major layout"
    # On CPU the step runs compiled ahead, without Dynamo's guards on every call.
    assert compiled._fused.ahead and compiled._fused.loaded == 0 and len(list(tmp_path.iterdir())) == 1

    reloaded = QuadHover(cfg, 64, CPU, seed=3)
    reloaded._fused = CompiledFusedStep("cpu", tmp_path)
    replay = QuadHover(cfg, 64, CPU, seed=3)
    replay._fused = compiled._fused
    for _ in range(10):
        action = torch.rand(64, 4, generator=gen) * 2 - 1
        o1, r1, te1, _, _ = replay.step(action)
        o2, r2, te2, _, _ = reloaded.step(action)
        assert torch.equal(r1, r2) and torch.equal(te1, te2) and torch.equal(o1["policy"], o2["policy"])
    assert reloaded._fused.loaded == 1, "the saved step was loaded, not compiled again"


def test_fused_step_on_the_accelerator_path_restarts_from_fresh_rows() -> None:
    """Without host checks (the CUDA path: no sync per step) every step draws fresh rows for
    all envs and the ended ones restart from theirs, inside the initial distribution."""
    cfg = QuadHoverCfg()
    env = QuadHover(cfg, 64, CPU, seed=6)
    env._fused, env._host_checks = fused_step, False
    gen = torch.Generator().manual_seed(2)
    restarted = 0
    for _ in range(60):
        obs, _, terminated, truncated, _ = env.step(torch.rand(64, 4, generator=gen) * 2 - 1)
        done = terminated | truncated
        restarted += int(done.sum())
        assert torch.all(env.episode_step[done] == 0)
        offset = env.sim.state[done, 0:3] - torch.tensor(cfg.setpoint_w)
        assert torch.all(offset.abs() <= cfg.init_pos_range_m + 1e-6)
        assert torch.isfinite(obs["policy"]).all()
    assert restarted > 32


def test_a_checkpoint_pool_without_heading_columns_resumes_the_same_episodes() -> None:
    """Checkpoints written before the pool carried (cos, sin) of the setpoint yaw hold 30
    columns; loading one adds the columns, and the run continues exactly as from a new one."""
    env = QuadHover(QuadHoverCfg(), 32, CPU, seed=2)
    action = torch.full((32, 4), env.hover_action)
    wild = action.clone()
    wild[:, 0] = 1.0  # tumbles: episodes end and restart from pool rows
    for _ in range(40):
        env.step(wild)
    state = env.state_dict()
    assert state["init_pool"].shape[1] == 32
    old = {**state, "init_pool": state["init_pool"][:, :30].clone()}
    first = [env.step(wild)[0]["policy"] for _ in range(30)]
    env.load_state_dict(old)
    again = [env.step(wild)[0]["policy"] for _ in range(30)]
    assert env.episode_step.min() < 30  # some episodes restarted from the converted pool
    for a, b in zip(first, again):
        assert torch.equal(a, b)
