"""Camera images in the off-policy learners (``algo.encoder: cnn``): uint8 replay images, random
shifts, which losses train the encoder, ONNX export, o2o on image datasets and resume.

Rendering needs an offscreen GL platform (EGL or OSMesa); without one the tests that render are
skipped with the packages to install.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.algo import PreloadSource, Transition
from embodied.algos.fasttd3 import FastTD3, FastTD3Cfg
from embodied.algos.o2o import O2O, O2OCfg
from embodied.algos.residual import ResidualCfg
from embodied.algos.sac import SAC, SACCfg
from embodied.config import ConfigError
from embodied.data.collect import collect_episodes
from embodied.data.demos import write_dataset
from embodied.data.replay import ReplayBuffer, replay_bytes
from embodied.env import IMAGE_GROUP, ObsDict
from embodied.errors import EmbodiedError, MissingDependencyError
from embodied.export.image_onnx import export_image_onnx
from embodied.export.layers import mlp_arrays
from embodied.policies.image_actor import ImageActor
from embodied.policies.image_shift import random_shift
from embodied.tasks.arm_push import ArmPush, ArmPushCfg
from embodied.tasks.arm_push_expert import ScriptedExpert

SIZE_PX = 40
TINY = {"actor_hidden": (32,), "critic_hidden": (32,), "image_features": 16, "batch_size": 8}


def camera_env(num_envs: int, seed: int = 0, size_px: int = SIZE_PX, max_episode_steps: int = 10) -> ArmPush:
    """Arm-push with its ``top`` camera; skips the test when no offscreen GL exists here."""
    cfg = ArmPushCfg()
    backend = dataclasses.replace(cfg.backend, camera="top", image_size_px=size_px, max_episode_steps=max_episode_steps)
    try:
        return ArmPush(dataclasses.replace(cfg, backend=backend), num_envs=num_envs, device="cpu", seed=seed)
    except MissingDependencyError as err:  # names the Debian packages (EGL or OSMesa)
        pytest.skip(str(err))


def fill(algo: SAC | FastTD3, env: ArmPush, steps: int, obs: ObsDict | None = None) -> ObsDict:
    """``steps`` vectorized env steps with the learner's exploration actions, all observed."""
    obs = env.reset(seed=0) if obs is None else obs
    for _ in range(steps):
        action = algo.act(obs)
        nxt, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
        obs = nxt
    return obs


def image_learner(algo_cls: type, env: ArmPush) -> SAC | FastTD3:
    """A tiny SAC or FastTD3 (scalar critics) with the CNN encoder, 32 replay rows per env."""
    if algo_cls is SAC:
        return SAC(SACCfg(encoder="cnn", buffer_size_per_env=32, n_step=2, **TINY), env)  # type: ignore[arg-type]
    return FastTD3(FastTD3Cfg(encoder="cnn", buffer_size_per_env=32, num_atoms=0, **TINY), env)  # type: ignore[arg-type]


def test_replay_keeps_uint8_images_and_n_step_successor_images() -> None:
    spec = {"policy": (1,), IMAGE_GROUP: (4, 4, 3)}
    replay = ReplayBuffer(1, 16, spec, 1, n_step=3, gamma=0.5, seed=0, uint8_groups=[IMAGE_GROUP])
    assert replay.obs[IMAGE_GROUP].dtype == torch.uint8 and replay.next_obs[IMAGE_GROUP].dtype == torch.uint8
    assert replay.obs["policy"].dtype == torch.float32
    for t in range(10):  # image pixels = step index (+100 in the successor); episode ends at t = 5
        image = torch.full((1, 4, 4, 3), t, dtype=torch.uint8)
        done = torch.tensor([t == 5])
        replay.add(
            {"policy": torch.full((1, 1), float(t)), IMAGE_GROUP: image},
            torch.zeros(1, 1),
            torch.ones(1),
            done,
            torch.zeros(1, dtype=torch.bool),
            {"policy": torch.full((1, 1), t + 100.0), IMAGE_GROUP: image + 100},
        )
    batch = replay.sample(256)
    assert batch.obs[IMAGE_GROUP].dtype == torch.uint8 and batch.next_obs[IMAGE_GROUP].dtype == torch.uint8
    start = batch.obs["policy"][:, 0].long()
    assert torch.equal(batch.obs[IMAGE_GROUP][:, 0, 0, 0].long(), start)
    # the successor image is that of the window's last step, cut at the episode end (t = 5)
    last = torch.where((start <= 5) & (start + 2 >= 5), torch.full_like(start, 5), start + 2)
    assert torch.equal(batch.next_obs[IMAGE_GROUP][:, 0, 0, 0].long(), last + 100)
    assert torch.equal(batch.next_obs["policy"][:, 0].long(), last + 100)
    assert set(start.tolist()) == set(range(8))  # every full window was drawn
    # a byte per pixel: a quarter of what float32 storage would take
    floats = replay_bytes(16, 1, spec, 1)
    assert replay_bytes(16, 1, spec, 1, uint8_groups=[IMAGE_GROUP]) == floats - 2 * 16 * 48 * 3
    with pytest.raises(EmbodiedError, match="uint8 groups"):
        ReplayBuffer(1, 4, {"policy": (1,)}, 1, uint8_groups=[IMAGE_GROUP])


def test_random_shift_moves_at_most_pad_px_and_zero_is_identity() -> None:
    height, width = 12, 10
    rows = torch.arange(height)[:, None].expand(height, width)
    cols = torch.arange(width)[None, :].expand(height, width)
    # pixel value = its own coordinates, so every output pixel says where it was read from
    images = torch.stack([rows, cols, torch.zeros_like(rows)], dim=-1).to(torch.uint8).repeat(64, 1, 1, 1)
    assert random_shift(images, 0) is images
    torch.manual_seed(0)
    pad = 3
    out = random_shift(images, pad)
    assert out.shape == images.shape and out.dtype == torch.uint8
    seen = set()
    for image in out:
        dy = int(image[height // 2, 0, 0]) - height // 2
        dx = int(image[0, width // 2, 1]) - width // 2
        assert abs(dy) <= pad and abs(dx) <= pad
        seen.add((dy, dx))
        # one whole-pixel shift per image, edges replicated (reads clamped into the image)
        want_rows = (torch.arange(height) + dy).clamp(0, height - 1)[:, None].expand(height, width)
        want_cols = (torch.arange(width) + dx).clamp(0, width - 1)[None, :].expand(height, width)
        assert torch.equal(image[..., 0].long(), want_rows) and torch.equal(image[..., 1].long(), want_cols)
    assert len(seen) > 10  # shifts differ between images
    with pytest.raises(ValueError, match="pad_px"):
        random_shift(images, -1)


@pytest.mark.parametrize("algo_cls", [SAC, FastTD3])
def test_critic_loss_trains_the_encoder_and_the_actor_loss_does_not(algo_cls: type) -> None:
    torch.manual_seed(0)
    env = camera_env(2)
    algo = image_learner(algo_cls, env)
    assert isinstance(algo.policy, ImageActor) and algo.images is not None
    assert algo.replay.obs[IMAGE_GROUP].dtype == torch.uint8
    fill(algo, env, 12)
    encoder, head = algo.images.encoder, algo.policy.head
    assert algo.policy.encoder is encoder  # acting reads the encoder the critics train
    raw = algo.sample_batch()
    batch = algo.images.encode(algo.prepare(raw), raw)
    assert batch.actor_obs.shape == (8, algo.obs_dim + 16) and batch.critic_obs.shape == (8, algo.critic_obs_dim + 16)
    actor_loss, _ = algo.actor_loss(algo.images.for_actor(batch))
    actor_loss.backward()
    assert all(p.grad is None for p in encoder.parameters())
    assert all(p.grad is None for p in algo.images.target.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())
    algo.actor_opt.zero_grad(set_to_none=True)
    critic_loss, _ = algo.critic_loss(batch)
    critic_loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder.parameters())
    assert all(p.grad is None for p in head.parameters())
    # one update moves the encoder through the critic step and its target by Polyak averaging
    target_before = [p.detach().clone() for p in algo.images.target.parameters()]
    encoder_before = [p.detach().clone() for p in encoder.parameters()]
    algo.update(1)
    for old, enc, tgt in zip(encoder_before, encoder.parameters(), algo.images.target.parameters(), strict=True):
        assert not torch.equal(old, enc)
        assert torch.allclose(tgt, (1 - algo.cfg.tau) * old + algo.cfg.tau * enc, atol=1e-6)
    assert not any(torch.equal(a, b) for a, b in zip(target_before, encoder.parameters(), strict=True))
    # a deterministic action reads the image: other pixels, another action
    obs = env.reset(seed=1)
    dark = {**obs, IMAGE_GROUP: torch.zeros_like(obs[IMAGE_GROUP])}
    assert not torch.allclose(algo.policy.act(obs, deterministic=True), algo.policy.act(dark, deterministic=True))


def test_checkpoint_keeps_encoder_target_and_optimizer(tmp_path: Path) -> None:
    """A checkpoint (saved and loaded as the trainer does) holds the encoder, its target and the
    encoder's optimizer state, and continues bit-exactly."""
    torch.manual_seed(0)
    env = camera_env(2)
    cfg = SACCfg(encoder="cnn", buffer_size_per_env=32, **TINY)  # type: ignore[arg-type]
    algo = SAC(cfg, env)
    fill(algo, env, 10)
    algo.update(3)
    torch.save(algo.state_dict(), tmp_path / "ckpt.pt")
    twin = SAC(cfg, env)
    assert twin.images is not None and algo.images is not None
    assert not torch.equal(next(algo.images.target.parameters()), next(twin.images.target.parameters()))
    twin.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    for mine, theirs in [(algo.images.encoder, twin.images.encoder), (algo.images.target, twin.images.target)]:
        for a, b in zip(mine.state_dict().values(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b)
    enc_param, twin_param = next(algo.images.encoder.parameters()), next(twin.images.encoder.parameters())
    assert torch.equal(algo.critic_opt.state[enc_param]["exp_avg"], twin.critic_opt.state[twin_param]["exp_avg"])
    assert torch.equal(twin.replay.obs[IMAGE_GROUP], algo.replay.obs[IMAGE_GROUP])
    results = []
    for learner in (algo, twin):
        torch.manual_seed(5)  # the same batch draws and shifts
        metrics = learner.update(2)
        assert learner.images is not None
        params = [*learner.policy.parameters(), *learner.images.target.parameters()]
        results.append((metrics, [p.detach().clone() for p in params]))
    assert results[0][0] == results[1][0]
    for p, q in zip(results[0][1], results[1][1], strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("algo_cls", [SAC, FastTD3])
def test_onnx_export_of_a_cnn_policy_matches_torch(tmp_path: Path, algo_cls: type) -> None:
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    env = camera_env(4)
    algo = image_learner(algo_cls, env)
    obs = fill(algo, env, 10)  # non-trivial normalizer statistics
    algo.update(2)
    module = algo.policy.export_module()
    recorded = {"obs": obs["policy"].numpy(), "image": obs[IMAGE_GROUP].numpy()}
    report = export_image_onnx(module, env.io_spec(), tmp_path, recorded, camera="top")
    assert report.max_abs_err <= 1e-5
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    (got,) = session.run(["action"], recorded)
    want = algo.policy.act(obs, deterministic=True).numpy()  # SAC's mean through tanh, TD3's actor
    assert np.abs(got - want).max() <= 1e-5
    with pytest.raises(EmbodiedError, match="Conv2d"):
        mlp_arrays(module)  # the C exporter refuses it, as PPO's image policy


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match=r"algo\.encoder must be 'mlp' or 'cnn'"):
        SACCfg(encoder="resnet")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"algo\.image_features"):
        FastTD3Cfg(image_features=0)
    with pytest.raises(ConfigError, match=r"algo\.image_shift_px"):
        SACCfg(image_shift_px=-1)
    with pytest.raises(ConfigError, match=r"algo\.encoder must be mlp for residual"):
        ResidualCfg(encoder="cnn")
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    with pytest.raises(ConfigError, match=r"env\.backend\.camera"):
        SAC(SACCfg(encoder="cnn"), env)


def _image_dataset(tmp_path: Path, images: bool) -> Path:
    env = camera_env(2)
    episodes = collect_episodes(env, ScriptedExpert().act, 2, seed=0, images=images, noise_std=0.3)
    return write_dataset(tmp_path / f"demos_{images}", episodes, "test/arm-push-images-v0", "scripted")


def test_o2o_cnn_learns_offline_then_online_from_an_image_dataset(tmp_path: Path) -> None:
    torch.manual_seed(0)
    env = camera_env(2)
    cfg = O2OCfg(
        encoder="cnn",
        num_critics=2,
        cql_num_actions=2,
        offline_steps=4,
        offline_updates_per_step=2,
        learning_starts=4,
        buffer_size_per_env=32,
        **TINY,  # type: ignore[arg-type]
    )
    algo = O2O(cfg, env)
    with pytest.raises(EmbodiedError, match=r"'image'.*--images"):
        algo.preload(PreloadSource(dataset=_image_dataset(tmp_path, images=False)))
    algo.preload(PreloadSource(dataset=_image_dataset(tmp_path, images=True)))
    assert algo.images is not None
    encoder_before = [p.detach().clone() for p in algo.images.encoder.parameters()]
    obs = env.reset(seed=0)
    while algo.phase == "offline":
        obs = fill(algo, env, 1, obs)
        metrics = algo.update()
    assert metrics["offline_updates"] == 4.0 and "cql_penalty" in metrics
    assert any(not torch.equal(a, b) for a, b in zip(encoder_before, algo.images.encoder.parameters(), strict=True))
    obs = fill(algo, env, 4, obs)
    assert algo.ready_to_update()
    online = algo.sample_batch()  # RLPD: half dataset rows, half replay rows, images in both
    assert online.obs[IMAGE_GROUP].shape == (8, SIZE_PX, SIZE_PX, 3) and online.obs[IMAGE_GROUP].dtype == torch.uint8
    metrics = algo.update()
    assert metrics["phase"] == 2.0 and np.isfinite(metrics["critic_loss"])


def test_cli_train_resume_eval_export_with_images(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the shared trainer and CLI: SAC with the CNN trains, resumes, evaluates, exports
    ONNX (the graph flies the env like torch) and is refused by the C exporter."""
    import json

    from embodied.cli import main
    from embodied.training.run import load_run

    camera_env(1)  # skips without offscreen GL
    run_dir = tmp_path / "run"
    tiny = [
        "env.backend.camera=top", "env.backend.image_size_px=40", "env.backend.max_episode_steps=8",
        "algo.encoder=cnn", "algo.image_features=16", "algo.actor_hidden=[32]", "algo.critic_hidden=[32]",
        "algo.batch_size=8", "algo.buffer_size_per_env=64", "algo.learning_starts=8", "algo.updates_per_step=1",
        "trainer.eval_episodes=2", "trainer.torch_threads=1", "trainer.checkpoint_every_updates=2",
    ]  # fmt: skip
    argv = ["train", "arm-push", "--algo", "sac", "--run-dir", str(run_dir), "--no-progress", "--num-envs", "2"]
    assert main([*argv, *tiny, "trainer.total_env_steps=16"]) == 0
    assert main(["train", "--resume", str(run_dir), "--no-progress", "trainer.total_env_steps=24"]) == 0
    loaded = load_run(run_dir).algo
    assert loaded.env_steps == 24 and loaded.images is not None
    assert loaded.replay.obs[IMAGE_GROUP].dtype == torch.uint8
    assert main(["eval", str(run_dir), "--episodes", "2", "--json"]) == 0
    assert main(["export", str(run_dir), "--format", "onnx", "--no-record"]) == 0
    assert main(["eval", str(run_dir), "--episodes", "2", "--json", "--policy", "onnx"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    torch_eval, onnx_eval = lines[-2], lines[-1]
    assert onnx_eval["policy"] == "onnx"
    assert abs(onnx_eval["mean_return"] - torch_eval["mean_return"]) < 1e-4
    assert main(["export", str(run_dir), "--format", "c"]) == 2
    assert "Conv2d" in caplog.text


@pytest.mark.slow  # ~2 min on a 2-core CPU: 4,000 rendered steps and 500 CNN updates of batch 128
def test_sac_with_images_learns_to_reach() -> None:
    """SAC with the CNN encoder (image + proprioception) learns to bring the fingertip to the
    block (arm-push, reach term only, 48 px images, as PPO's image test): the return rises past a
    level that neither the untrained policy (-9.9 with this seed) nor uniformly random actions
    (-8.9 to -9.3 over 3 seeds) nor the zero action (-8.7) reach; trained, -2.8 (docs/benchmarks/cameras.md)."""
    from test_images import _reach_env, _reach_return

    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = _reach_env(8, seed=0)
    cfg = SACCfg(
        encoder="cnn",
        image_features=32,
        actor_hidden=(128, 128),
        critic_hidden=(128, 128),
        buffer_size_per_env=5_000,
        batch_size=128,
        learning_starts=400,
        gamma=0.95,
        init_alpha=0.01,  # the per-step reward is ~0.25 m: a larger entropy bonus swamps it at first
    )
    algo = SAC(cfg, env)
    untrained = _reach_return(algo.policy)
    obs = env.reset(seed=0)
    for _ in range(10):  # 50 env steps x 8 envs, then 50 updates
        obs = fill(algo, env, 50, obs)
        for _ in range(50):
            algo.update()
    trained = _reach_return(algo.policy)
    assert trained > -4.5, (untrained, trained)
    assert trained > untrained + 3.0, (untrained, trained)


@pytest.mark.parametrize("algo_name", ["sac", "fasttd3", "o2o", "residual"])
def test_runs_saved_before_the_encoder_keys_load(tmp_path: Path, algo_name: str) -> None:
    """An off-policy config.yaml from before the release of the camera keys (``env.backend.camera``,
    ``algo.encoder``, ``algo.image_features``, ``algo.image_shift_px``) loads with the MLP."""
    import yaml

    from embodied.experiment import VISION_RELEASE_KEYS, load_experiment, resolve_experiment
    from embodied.training.run import write_config

    write_config(tmp_path, resolve_experiment("arm-push", algo_name))
    path = tmp_path / "config.yaml"
    data = yaml.safe_load(path.read_text())
    for dotted in VISION_RELEASE_KEYS:  # the keys of that release this config has
        section, *inner, name = dotted.split(".")
        holder = data[section]
        for part in inner:
            holder = holder.get(part, {})
        holder.pop(name, None)
    path.write_text(yaml.safe_dump(data))
    loaded = load_experiment(path)
    assert loaded.algo.encoder == "mlp" and loaded.algo.image_shift_px == 4 and loaded.env.backend.camera == ""
