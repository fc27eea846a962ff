"""ReinFlow on a pretrained flow-matching VLA: a tiny SmolVLA (lerobot 0.4.4's real architecture,
random weights, a tiny local SmolVLM backbone config and tokenizer) saved with ``save_pretrained``
and loaded through ``--base lerobot:PATH``. The action expert's chain is LeRobot's own sampler,
the backbone runs once per observation, the first importance ratio is 1 on every update, only
the configured expert parts move, and the trainer runs it like any other algorithm.

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``); skips elsewhere.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from env_support import fill_rollout
from lerobot_support import save_policy
from test_lerobot_base import arm_push_env

from embodied.algo import PreloadSource
from embodied.algos.reinflow import RATIO_TOL, ReinFlow, ReinFlowCfg, VLAFineTuneCfg, check_first_ratio
from embodied.cli import main
from embodied.env import IMAGE_GROUP
from embodied.errors import EmbodiedError
from embodied.policies.lora import lora_parameter_count
from embodied.policies.vla import LeRobotPolicy, actions_to_unit, lerobot_batch
from embodied.training.lerobot_base import load_lerobot_policy
from embodied.training.run import CHECKPOINT_FILE, load_run

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None,
    reason="lerobot is not installed here; its environment comes from bash scripts/setup_lerobot.sh",
)

SMALL: dict[str, Any] = {
    "num_steps_per_env": 3,
    "num_epochs": 2,
    "num_minibatches": 2,
    "critic_warmup_updates": 0,
    "critic_hidden": (32, 32),
    "noise_hidden": (32,),
    "actor_lr": 1e-3,
}


@pytest.fixture(scope="module")
def smolvla(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smolvla")
    argv = ["collect", "scripted:arm-push", "--episodes", "3", "--num-envs", "3", "--images", "--camera", "top"]
    assert main([*argv, "--format", "lerobot", "--out", str(root / "demos")]) == 0
    return save_policy("smolvla", root / "demos", root / "smolvla")


def reinflow(path: Path, env: Any, **kw: Any) -> ReinFlow:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    base = load_lerobot_policy(f"lerobot:{path}", "arm-push", env.obs_spec, env.action_dim, "top")
    algo = ReinFlow(ReinFlowCfg(**(SMALL | kw)), env)
    algo.preload(PreloadSource(base_run=path, base_policy=base))
    return algo


def train_argv(smolvla: Path, run: Path, *overrides: str) -> list[str]:
    """``embodied train`` of a tiny ReinFlow run on ``smolvla`` into ``run`` (24 env steps)."""
    argv = ["train", "arm-push", "--algo", "reinflow", "--base", f"lerobot:{smolvla}", "--run-dir", str(run)]
    argv += ["--num-envs", "2", "--no-progress", "env.backend.camera=top", "trainer.eval_episodes=2"]
    argv += ["trainer.torch_threads=1", "trainer.total_env_steps=24", "algo.num_steps_per_env=3"]
    return [*argv, "algo.num_minibatches=2", "algo.num_epochs=1", "algo.critic_hidden=[32,32]", *overrides]


def spy_on_first_ratio(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record ``max |ratio - 1|`` of every update's first minibatch (the check still runs)."""
    import embodied.algos.reinflow as mod

    seen: list[float] = []

    def spy(ratio: torch.Tensor, update: int) -> None:
        seen.append(float((ratio.detach() - 1).abs().max()))
        check_first_ratio(ratio, update)

    monkeypatch.setattr(mod, "check_first_ratio", spy)
    return seen


def test_noise_free_chain_is_lerobots_sampler(smolvla: Path) -> None:
    """Without the learned noise the chain's steps reproduce SmolVLA's own sample_actions."""
    env = arm_push_env(2)
    algo = reinflow(smolvla, env, vla=VLAFineTuneCfg(bf16=False))  # LeRobot's sampler runs float32
    chain = algo.chain
    obs = env.reset(seed=0)
    cond = chain.encode(obs)
    x0 = torch.randn(2, chain.flat_dim, generator=torch.Generator().manual_seed(1))
    x = x0
    with torch.no_grad():
        for k in range(chain.denoise_steps):
            x = chain.step_mean(cond, x, k)
    lerobot = algo.policy.lerobot
    policy = algo.policy
    assert isinstance(policy, LeRobotPolicy)
    batch = policy.preprocessor(lerobot_batch(obs, policy.instruction, policy.cameras, policy.state_group))
    noise = x0.reshape(2, lerobot.config.chunk_size, lerobot.config.max_action_dim)
    with torch.no_grad():
        want = lerobot.predict_action_chunk(batch, noise=noise)
    got = chain.actions(x)
    want_unit = actions_to_unit(policy.postprocessor(want).float(), policy.action_low, policy.action_high)
    torch.testing.assert_close(got, want_unit, atol=1e-5, rtol=0)
    env.close()


def test_padding_slots_step_without_noise(smolvla: Path) -> None:
    """By default (``algo.noisy_entries=actions``) only the task's action entries are noised: the
    slots padding actions to ``max_action_dim`` follow the expert's Euler steps exactly."""
    env = arm_push_env(2)
    algo = reinflow(smolvla, env)
    chain = algo.chain
    h, p, a = chain.chunk_spec.length, chain.slots, chain.action_dim
    assert p > a  # the test needs padding
    assert len(algo.noisy) == h * a
    cond = chain.encode(env.reset(seed=0))
    sampled = algo.sample_chain(cond)
    with torch.no_grad():
        for k in range(chain.denoise_steps):
            mean = chain.step_mean(cond, sampled[:, k], k).reshape(2, h, p)
            step = sampled[:, k + 1].reshape(2, h, p)
            torch.testing.assert_close(step[:, :, a:], mean[:, :, a:], atol=1e-6, rtol=0)
            assert float((step[:, :, :a] - mean[:, :, :a]).abs().min()) > 0.0
    env.close()


def test_first_ratio_is_one_and_only_the_expert_trains(smolvla: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = arm_push_env(2)
    algo = reinflow(smolvla, env, vla=VLAFineTuneCfg(train="last_layers", last_layers=1, backbone_micro_batch=1))
    seen = spy_on_first_ratio(monkeypatch)
    lerobot = algo.policy.lerobot
    before = {name: p.detach().clone() for name, p in lerobot.named_parameters()}
    trained = {id(p) for p in algo.chain.trainable_parameters()}
    backbone_calls = []
    encode = algo.chain._encode  # type: ignore[attr-defined]

    def counting(obs: Any) -> Any:
        backbone_calls.append(int(next(iter(obs.values())).shape[0]))
        return encode(obs)

    algo.chain._encode = counting  # type: ignore[attr-defined]
    obs = env.reset(seed=0)
    for _ in range(2):
        obs = fill_rollout(algo, env, obs)
        calls = len(backbone_calls)
        metrics = algo.update()
        assert len(backbone_calls) == calls  # the update reuses the cached backbone features
        assert math.isfinite(metrics["policy_loss"])
    # one micro-batch of 1 per env per chain, plus the bootstrap value of each rollout's last observation
    assert backbone_calls.count(1) >= 2 * 3 * 2
    assert seen and max(seen) <= RATIO_TOL
    changed = {name for name, p in lerobot.named_parameters() if not torch.equal(p, before[name])}
    names = {name for name, p in lerobot.named_parameters() if id(p) in trained}
    assert changed and changed <= names
    assert not any("vlm.model" in name for name in changed)  # the backbone stays frozen
    last = len(algo.chain.model.vlm_with_expert.lm_expert.layers) - 1  # type: ignore[attr-defined]
    assert all("lm_expert.layers" not in n or f"layers.{last}." in n for n in changed)
    env.close()


def test_demonstrated_chunks_map_into_the_experts_chain(smolvla: Path) -> None:
    """A demonstrated chunk's chain state (normalized as the checkpoint's processors do, padded to
    max_action_dim) is one whose actions, through LeRobot's own post-processor, are that chunk."""
    env = arm_push_env(2)
    algo = reinflow(smolvla, env, vla=VLAFineTuneCfg(bf16=False))
    chain = algo.chain
    chunks = torch.rand(5, chain.chunk_spec.length, env.action_dim, generator=torch.Generator().manual_seed(0))
    chunks = 1.8 * chunks - 0.9
    state, weight = chain.demo_chain_state(chunks)
    torch.testing.assert_close(chain.actions(state), chunks, atol=1e-5, rtol=0)
    slots = weight.reshape(5, chain.chunk_spec.length, -1)
    assert slots.shape[-1] > env.action_dim  # the tiny config pads actions, so padding is checked
    assert bool(slots[..., : env.action_dim].eq(1).all()) and bool(slots[..., env.action_dim :].eq(0).all())
    env.close()


def test_demonstrations_train_the_expert_beside_ppo(smolvla: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With --dataset (a LeRobotDataset with the camera), every actor step takes the flow-matching
    loss on demonstrations; the first importance ratio is still 1 and the backbone stays frozen."""
    env = arm_push_env(2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    demos = smolvla.parent / "demos"
    base = load_lerobot_policy(f"lerobot:{smolvla}", "arm-push", env.obs_spec, env.action_dim, "top")
    algo = ReinFlow(ReinFlowCfg(**(SMALL | {"demo_batch": 4, "micro_batch": 2})), env)  # demos in 2 parts
    algo.preload(PreloadSource(base_run=smolvla, base_policy=base, dataset=demos))
    assert algo.demos is not None and IMAGE_GROUP in algo.demos.obs
    seen = spy_on_first_ratio(monkeypatch)
    before = {name: p.detach().clone() for name, p in algo.policy.lerobot.named_parameters()}
    obs = env.reset(seed=0)
    for _ in range(2):
        obs = fill_rollout(algo, env, obs)
        metrics = algo.update()
        assert math.isfinite(metrics["demo_loss"]) and metrics["demo_loss"] > 0.0
    assert seen and max(seen) <= RATIO_TOL
    changed = {n for n, p in algo.policy.lerobot.named_parameters() if not torch.equal(p, before[n])}
    assert changed and not any("vlm.model" in name for name in changed)
    env.close()


@pytest.mark.slow  # the whole trainer, resume and export (minutes on a loaded 2-core CPU)
def test_trainer_fine_tunes_and_rebuilds_a_smolvla_run(smolvla: Path, tmp_path: Path) -> None:
    run = tmp_path / "rf"
    argv = train_argv(smolvla, run, "algo.micro_batch=2")
    assert main(argv) == 0
    assert (run / CHECKPOINT_FILE).is_file()
    checkpoint = torch.load(run / CHECKPOINT_FILE, weights_only=False)
    saved = checkpoint["algo"]["policy"]
    assert saved and not any("vlm.model" in name for name in saved)  # the frozen backbone is not copied
    loaded = load_run(run)  # the base comes from lerobot:PATH again, the expert from the checkpoint
    params = dict(loaded.policy.named_parameters())
    for name, value in saved.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=0)
    assert main(["train", "--resume", str(run), "trainer.total_env_steps=36", "--no-progress"]) == 0

    # back to LeRobot: its own from_pretrained loads the fine-tuned expert, and the export checked
    # the loaded policy's chunks against the run's (same sampling seed) to 1e-5
    assert main(["export", str(run), "--format", "onnx"]) == 2  # refused, naming --format lerobot
    assert main(["export", str(run), "--format", "lerobot"]) == 0
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    exported = SmolVLAPolicy.from_pretrained(run / "export" / "lerobot")
    fine_tuned = dict(load_run(run).policy.lerobot.named_parameters())
    for name, value in exported.named_parameters():
        torch.testing.assert_close(value, fine_tuned[name], rtol=0, atol=0)


def lerobot_chunk(algo: ReinFlow, obs: Any, noise: torch.Tensor) -> torch.Tensor:
    """LeRobot's own sampler's chunk ``[B, H, P]`` on ``obs`` from start noise ``noise``."""
    policy = algo.policy
    batch = policy.preprocessor(lerobot_batch(obs, policy.instruction, policy.cameras, policy.state_group))
    with torch.no_grad():
        return policy.lerobot.predict_action_chunk(batch, noise=noise)


def test_lora_starts_as_the_base_and_only_the_adapters_train(smolvla: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = arm_push_env(2)
    plain = reinflow(smolvla, env, vla=VLAFineTuneCfg(bf16=False))
    expert_layers = plain.chain.model.vlm_with_expert.lm_expert.layers  # type: ignore[attr-defined]
    predicted = lora_parameter_count(expert_layers, 4)
    algo = reinflow(smolvla, env, vla=VLAFineTuneCfg(train="lora", lora_rank=4, lora_alpha=8.0, bf16=False))
    trained = list(algo.chain.trainable_parameters())
    assert sum(p.numel() for p in trained) == predicted > 0
    lerobot = algo.policy.lerobot
    names = {name for name, p in lerobot.named_parameters() if p.requires_grad}
    assert names and all(name.endswith(("lora_a", "lora_b")) for name in names)
    assert all("lm_expert.layers" in name for name in names)
    # B = 0: the adapted expert is the base, sample for sample
    obs = env.reset(seed=0)
    noise = torch.randn(2, lerobot.config.chunk_size, lerobot.config.max_action_dim)
    torch.testing.assert_close(lerobot_chunk(algo, obs, noise), lerobot_chunk(plain, obs, noise), rtol=0, atol=0)

    seen = spy_on_first_ratio(monkeypatch)
    before = {name: p.detach().clone() for name, p in lerobot.named_parameters()}
    for _ in range(2):
        obs = fill_rollout(algo, env, obs)
        assert math.isfinite(algo.update()["policy_loss"])
    assert seen and max(seen) <= RATIO_TOL
    changed = {name for name, p in lerobot.named_parameters() if not torch.equal(p, before[name])}
    assert changed and changed <= names  # gradients reach the adapters only
    assert any(name.endswith("lora_b") for name in changed)
    env.close()


def test_lora_checkpoint_resumes_and_merges_into_a_plain_smolvla(smolvla: Path) -> None:
    env = arm_push_env(2)
    cfg = VLAFineTuneCfg(train="lora", lora_rank=4, lora_alpha=8.0, bf16=False)  # scale 2
    algo = reinflow(smolvla, env, vla=cfg)
    obs = env.reset(seed=0)
    for _ in range(2):
        obs = fill_rollout(algo, env, obs)
        algo.update()
    state = algo.state_dict()
    assert state["policy"] and all(name.endswith(("lora_a", "lora_b")) for name in state["policy"])
    resumed = reinflow(smolvla, env, vla=cfg)
    resumed.load_state_dict(state)
    lerobot = algo.policy.lerobot
    noise = torch.randn(2, lerobot.config.chunk_size, lerobot.config.max_action_dim)
    adapted = lerobot_chunk(algo, obs, noise)
    torch.testing.assert_close(lerobot_chunk(resumed, obs, noise), adapted, rtol=0, atol=0)
    plain = reinflow(smolvla, env, vla=VLAFineTuneCfg(bf16=False))
    assert float((lerobot_chunk(plain, obs, noise) - adapted).abs().max()) > 1e-6  # the adapters moved it
    with pytest.raises(EmbodiedError, match=r"another algo\.vla\.train setting"):
        plain.load_state_dict(state)
    with pytest.raises(EmbodiedError, match=r"another algo\.vla\.train setting"):
        reinflow(smolvla, env, vla=cfg).load_state_dict(plain.state_dict())

    # merged: LeRobot's own module structure and keys again, the same chunks to 1e-5
    algo.merge_adapters()
    assert set(lerobot.state_dict()) == set(plain.policy.lerobot.state_dict())
    assert float((lerobot_chunk(algo, obs, noise) - adapted).abs().max()) <= 1e-5
    with pytest.raises(EmbodiedError, match="merged"):
        algo.state_dict()
    env.close()


@pytest.mark.slow  # the whole trainer and export (minutes on a loaded 2-core CPU)
def test_a_lora_run_evaluates_and_exports_as_a_plain_smolvla(smolvla: Path, tmp_path: Path) -> None:
    run = tmp_path / "rf"
    argv = train_argv(smolvla, run, "algo.vla.train=lora", "algo.vla.lora_rank=2", "algo.critic_warmup_updates=0")
    argv += ["algo.actor_lr=1e-3"]
    assert main(argv) == 0
    saved = torch.load(run / CHECKPOINT_FILE, weights_only=False)["algo"]["policy"]
    assert saved and all(name.endswith(("lora_a", "lora_b")) for name in saved)
    loaded = load_run(run)  # for use: the adapters are folded into the expert's weights
    assert not any("lora" in name for name in loaded.policy.lerobot.state_dict())
    assert main(["eval", str(run), "--episodes", "2"]) == 0
    assert main(["export", str(run), "--format", "lerobot"]) == 0  # parity with the run's policy to 1e-5
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    exported = SmolVLAPolicy.from_pretrained(run / "export" / "lerobot")
    merged = dict(loaded.policy.lerobot.named_parameters())
    for name, value in exported.named_parameters():
        torch.testing.assert_close(value, merged[name], rtol=0, atol=0)
