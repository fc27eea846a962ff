"""ReinFlow: exact chain log-likelihood, ratio 1 on the first minibatch, preload errors."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from env_support import fill_rollout

from embodied.algo import PreloadSource, PreloadUnsupportedError, Transition, preload_algorithm
from embodied.algos.bc_flow import BCFlow, BCFlowCfg
from embodied.algos.ppo import PPO, PPOCfg
from embodied.algos.reinflow import (
    RATIO_TOL,
    RatioCheckError,
    ReinFlow,
    ReinFlowCfg,
    check_first_ratio,
    noisy_entries,
)
from embodied.config import ConfigError
from embodied.errors import EmbodiedError
from embodied.policies.flow import FlowPolicy, FlowPolicyCfg
from embodied.tasks.arm_push import ArmPush, ArmPushCfg

FLOW = FlowPolicyCfg(hidden=(32, 32), chunk=2, denoise_steps=3)


@pytest.fixture
def env() -> ArmPush:
    torch.set_num_threads(1)
    return ArmPush(ArmPushCfg(), num_envs=4, device="cpu", seed=0)


def _algo(env: ArmPush, **kw: Any) -> ReinFlow:
    torch.manual_seed(0)
    algo = ReinFlow(
        ReinFlowCfg(policy=FLOW, num_steps_per_env=6, num_minibatches=2, num_epochs=2, critic_warmup_updates=0, **kw),
        env,
    )
    base = FlowPolicy(18, 3, FLOW)
    base.set_obs_stats(torch.zeros(18), torch.full((18,), 0.3))
    algo.preload(PreloadSource(base_policy=base))
    return algo


@pytest.mark.parametrize("noisy", ["all", "executed"])
def test_log_likelihood_matches_brute_force(env: ArmPush, noisy: str) -> None:
    algo = _algo(env, noisy_entries=noisy)
    obs_n = algo.policy.normalize(torch.randn(5, 18))
    chain = algo.sample_chain({"obs_n": obs_n})
    k_steps, f = FLOW.denoise_steps, algo.policy.flat_dim
    assert chain.shape == (5, k_steps + 1, f)
    # chunk 2 x 3 actions, exec_steps 1: "executed" noises the first position's 3 actions only
    noisy_js = list(range(f)) if noisy == "all" else [0, 1, 2]
    want = torch.zeros(5, dtype=torch.float64)
    with torch.no_grad():
        for b in range(5):
            total = 0.0
            for j in noisy_js:  # x0 ~ N(0, 1) per dimension
                x = float(chain[b, 0, j])
                total += -0.5 * x * x - 0.5 * math.log(2 * math.pi)
            x_k = chain[b, 0].clone()
            for k in range(k_steps):
                t = torch.tensor([k / k_steps])  # the grid t_k = k / K, written out here
                v = algo.policy.velocity(x_k[None], algo.policy.time_features(t), obs_n[b : b + 1])[0]
                log_var = algo.noise(obs_n[b : b + 1], algo.policy.time_features(t))[0]
                for j in range(f):
                    mean = float(x_k[j] + v[j] / k_steps)
                    x = float(chain[b, k + 1, j])
                    if j not in noisy_js:  # a deterministic entry: exactly its Euler step, no density
                        assert x == pytest.approx(mean, abs=1e-6)
                        continue
                    var = math.exp(float(log_var[noisy_js.index(j)]))
                    assert abs(x - mean) > 1e-7  # noised
                    total += -0.5 * (x - mean) ** 2 / var - 0.5 * math.log(2 * math.pi * var)
                x_k = chain[b, k + 1]
            want[b] = total / ((k_steps + 1) * len(noisy_js))
        got = algo.chain_log_prob({"obs_n": obs_n}, chain)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_noisy_entries_of_a_flow_policy(env: ArmPush) -> None:
    """A flow policy's chain has no padding, so ``actions`` is ``all``; ``executed`` keeps the
    entries of the first ``exec_steps`` positions; an unknown setting is refused by name."""
    chain = _algo(env).chain
    torch.testing.assert_close(noisy_entries(chain, "actions"), torch.arange(6))
    torch.testing.assert_close(noisy_entries(chain, "all"), torch.arange(6))
    torch.testing.assert_close(noisy_entries(chain, "executed"), torch.arange(3))
    with pytest.raises(ConfigError, match="noisy_entries"):
        ReinFlowCfg(noisy_entries="padding")  # type: ignore[arg-type]


def test_noise_is_bounded(env: ArmPush) -> None:
    algo = _algo(env, sigma_min=0.05, sigma_max=0.2)
    obs_n = torch.randn(64, 18) * 10
    with torch.no_grad():
        for k in range(FLOW.denoise_steps):
            _, log_var = algo.step_dist({"obs_n": obs_n}, torch.randn(64, algo.policy.flat_dim) * 5, k)
            sigma = torch.exp(0.5 * log_var)
            assert float(sigma.min()) >= 0.05 - 1e-6 and float(sigma.max()) <= 0.2 + 1e-6


def _rollout(algo: ReinFlow, env: ArmPush) -> None:
    fill_rollout(algo, env, env.reset(seed=1))


def test_first_minibatch_ratio_is_one_every_update(env: ArmPush, monkeypatch: pytest.MonkeyPatch) -> None:
    algo = _algo(env, actor_lr=1e-2)
    import embodied.algos.reinflow as mod

    seen: list[float] = []

    def spy(ratio: torch.Tensor, update: int) -> None:
        seen.append(float((ratio.detach() - 1).abs().max()))
        check_first_ratio(ratio, update)

    monkeypatch.setattr(mod, "check_first_ratio", spy)
    before = [p.detach().clone() for p in algo.policy.parameters()]
    for _ in range(3):
        _rollout(algo, env)
        metrics = algo.update()
        assert math.isfinite(metrics["policy_loss"])
    assert len(seen) == 3 and max(seen) <= RATIO_TOL
    # the actor did move, so the check is not trivially satisfied by a frozen policy
    assert any(not torch.equal(a, b) for a, b in zip(before, algo.policy.parameters(), strict=True))


def test_mismatched_grids_break_the_ratio_check(env: ArmPush) -> None:
    """The reference code's defect (sampling on linspace(0, 1, K), scoring on k/K) is caught."""
    algo = _algo(env)
    _rollout(algo, env)
    st = algo.storage
    obs_n = st.actor_obs.reshape(-1, 18)
    k_steps = FLOW.denoise_steps
    # re-sample the stored chains on the other grid and keep the k/K scores: what the defect does
    with torch.no_grad():
        x = torch.randn(obs_n.shape[0], algo.policy.flat_dim)
        chain = [x]
        for k, t in enumerate(torch.linspace(0, 1, k_steps).tolist()):
            tt = torch.full((x.shape[0],), t)
            mean = x + algo.policy.velocity(x, algo.policy.time_features(tt), obs_n) / k_steps
            _, log_var = algo.step_dist({"obs_n": obs_n}, x, k)
            x = mean + torch.exp(0.5 * log_var) * torch.randn_like(x)
            chain.append(x)
        chain_t = torch.stack(chain, 1)
        sampled_logp = torch.zeros(obs_n.shape[0])
        x0 = chain_t[:, 0]
        sampled_logp += (-0.5 * x0.square() - 0.5 * math.log(2 * math.pi)).sum(-1)
        for k, t in enumerate(torch.linspace(0, 1, k_steps).tolist()):
            tt = torch.full((x0.shape[0],), t)
            mean = chain_t[:, k] + algo.policy.velocity(chain_t[:, k], algo.policy.time_features(tt), obs_n) / k_steps
            _, log_var = algo.step_dist({"obs_n": obs_n}, chain_t[:, k], k)
            sampled_logp += (
                -0.5 * ((chain_t[:, k + 1] - mean).square() / log_var.exp() + log_var + math.log(2 * math.pi))
            ).sum(-1)
        sampled_logp /= (k_steps + 1) * algo.policy.flat_dim
        scored = algo.chain_log_prob({"obs_n": obs_n}, chain_t)
    with pytest.raises(RatioCheckError, match="first minibatch"):
        check_first_ratio(torch.exp(scored - sampled_logp), 0)


def test_preload_errors(env: ArmPush, tmp_path: Path) -> None:
    ppo = PPO(PPOCfg(num_steps_per_env=4), env)
    with pytest.raises(PreloadUnsupportedError, match="'ppo' does not start from a dataset"):
        preload_algorithm(ppo, "ppo", PreloadSource(dataset=tmp_path))
    reinflow = ReinFlow(ReinFlowCfg(policy=FLOW), env)
    with pytest.raises(EmbodiedError, match="give --base RUN_DIR"):
        reinflow.preload(PreloadSource(dataset=tmp_path))
    with pytest.raises(EmbodiedError, match="starts from a base policy"):
        reinflow.act(env.reset(seed=0))
    other = FlowPolicy(18, 3, FlowPolicyCfg(hidden=(32, 32), chunk=4, denoise_steps=3))
    with pytest.raises(ConfigError, match=r"chunk: base 4 vs algo\.policy 2"):
        reinflow.preload(PreloadSource(base_run=tmp_path, base_policy=other))
    with pytest.raises(EmbodiedError, match=r"holds a ActorCritic"):
        reinflow.preload(PreloadSource(base_run=tmp_path, base_policy=ppo.policy))
    bc = BCFlow(BCFlowCfg(policy=FLOW), env)
    with pytest.raises(EmbodiedError, match="give --dataset PATH"):
        bc.preload(PreloadSource(base_run=tmp_path))
    with pytest.raises(EmbodiedError, match="does not exist"):
        bc.preload(PreloadSource(dataset=tmp_path / "missing"))
    with pytest.raises(EmbodiedError, match="takes no base policy"):  # not silently ignored
        bc.preload(PreloadSource(dataset=tmp_path, base_run=tmp_path))


def test_micro_batches_accumulate_to_the_minibatch_gradient(env: ArmPush) -> None:
    """An update in micro-batches of 3 lands where the whole-minibatch update lands."""
    after = []
    for micro in (0, 3):
        algo = _algo(env, micro_batch=micro, actor_lr=1e-2)
        algo.generator.manual_seed(7)
        _rollout(algo, env)
        algo.update()
        after.append(torch.cat([p.detach().flatten() for p in [*algo.policy.parameters(), *algo.critic.parameters()]]))
    torch.testing.assert_close(after[0], after[1], rtol=0, atol=1e-5)


def test_a_chunk_drives_exec_steps_env_steps(env: ArmPush) -> None:
    """With exec_steps = 2 each chain's chunk runs two env steps; their rewards are one transition."""
    flow = FlowPolicyCfg(hidden=(32, 32), chunk=2, exec_steps=2, denoise_steps=3)
    torch.manual_seed(0)
    algo = ReinFlow(ReinFlowCfg(policy=flow, num_steps_per_env=3, critic_warmup_updates=0, gamma=0.5), env)
    algo.preload(PreloadSource(base_policy=FlowPolicy(18, 3, flow)))
    obs = env.reset(seed=0)
    steps = 0
    while not algo.ready_to_update():
        action = algo.act(obs)
        if steps % 2 == 1:  # the chunk's second action, no new chain
            assert torch.equal(action, algo._chunk[:, 1])  # type: ignore[index]
        reward = torch.full((4,), 1.0)
        done = torch.zeros(4, dtype=torch.bool)
        nxt = env.step(action)[0]
        algo.observe(Transition(obs, action, reward, done, done, nxt, nxt))
        obs, steps = nxt, steps + 1
    assert steps == 6 and algo.storage.cursor == 3
    # 1 + gamma: the chunk's two rewards, discounted inside the chunk
    torch.testing.assert_close(algo.storage.rewards, torch.full((3, 4), 1.5))
    assert math.isfinite(algo.update()["value_loss"])


@pytest.fixture
def demos(tmp_path: Path) -> Path:
    from embodied.cli import main

    out = tmp_path / "demos"
    assert main(["collect", "scripted:arm-push", "--episodes", "2", "--num-envs", "2", "--out", str(out)]) == 0
    return out


def _with_demos(env: ArmPush, dataset: Path, **kw: Any) -> ReinFlow:
    torch.manual_seed(0)
    cfg = ReinFlowCfg(policy=FLOW, num_steps_per_env=6, num_minibatches=2, num_epochs=2, critic_warmup_updates=0, **kw)
    algo = ReinFlow(cfg, env)
    base = FlowPolicy(18, 3, FLOW)
    base.set_obs_stats(torch.zeros(18), torch.full((18,), 0.3))
    algo.preload(PreloadSource(base_policy=base, dataset=dataset))
    return algo


def test_demonstrations_are_the_datasets_chunks_in_chain_space(env: ArmPush, demos: Path) -> None:
    """``--dataset`` gives every demonstration step its next H actions (the last one repeated past
    its episode's end) as a flow policy's chain state, all of it weighted."""
    from embodied.data.demos import load_dataset

    algo = _with_demos(env, demos)
    assert algo.demos is not None
    data = load_dataset(demos)
    want = torch.as_tensor(data.action_chunks(FLOW.chunk), dtype=torch.float32).clamp(-1, 1)
    torch.testing.assert_close(algo.demos.target, want.reshape(len(want), -1))
    assert torch.equal(algo.demos.weight, torch.ones_like(algo.demos.target))
    torch.testing.assert_close(algo.demos.obs["policy"], torch.as_tensor(data.obs, dtype=torch.float32))
    # the chain's own inverse: its actions are the demonstrated chunks
    torch.testing.assert_close(algo.chain.actions(algo.demos.target), want)


def test_demonstration_loss_moves_the_noise_free_chain_toward_the_demonstrations(env: ArmPush, demos: Path) -> None:
    """Updates with the demonstration term (no reward, so PPO has nothing to climb) bring the
    noise-free chunks on demonstrated observations closer to the demonstrated chunks; without the
    dataset the same updates do not."""

    def distance(algo: ReinFlow) -> float:
        assert algo.demos is not None
        cond = algo.chain.encode(algo.demos.obs)
        x = torch.zeros(algo.demos.steps, algo.chain.flat_dim)
        with torch.no_grad():
            for k in range(algo.chain.denoise_steps):
                x = algo.chain.step_mean(cond, x, k)
        return float((x - algo.demos.target).square().mean())

    def train(algo: ReinFlow) -> list[dict[str, float]]:
        obs = env.reset(seed=0)
        metrics = []
        for _ in range(4):
            while not algo.ready_to_update():
                action = algo.act(obs)
                nxt, _, term, trunc, info = env.step(action)
                zero = torch.zeros(4)  # no reward: only the demonstrations move the velocity field
                algo.observe(Transition(obs, action, zero, term, trunc, nxt, info["final_obs"]))
                obs = nxt
            metrics.append(algo.update())
        return metrics

    with_demos = _with_demos(env, demos, actor_lr=3e-3, demo_batch=32)
    before = distance(with_demos)
    metrics = train(with_demos)
    after = distance(with_demos)
    assert all(m["demo_loss"] > 0.0 for m in metrics)

    without = _with_demos(env, demos, actor_lr=3e-3)
    without.demos, reference = None, without.demos
    assert all(m["demo_loss"] == 0.0 for m in train(without))
    without.demos = reference
    assert after < 0.7 * min(before, distance(without)), (before, after, distance(without))


def test_a_dataset_with_demo_coef_zero_is_refused(env: ArmPush, demos: Path) -> None:
    with pytest.raises(ConfigError, match=r"algo\.demo_coef=0, so reinflow would not use it"):
        _with_demos(env, demos, demo_coef=0.0)
