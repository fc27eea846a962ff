"""Camera images: the MuJoCo backend's image group, the CNN encoder, its ONNX export and the
C exporter's refusal, and image demonstrations.

Rendering needs an offscreen GL platform (EGL or OSMesa); without one the tests that render are
skipped with the packages to install.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from env_support import fill_rollout

from embodied.algos.ppo import PPO, PPOCfg
from embodied.config import ConfigError
from embodied.data.collect import collect_episodes
from embodied.data.demos import load_dataset, write_dataset
from embodied.env import IMAGE_GROUP, RenderingEnv, renders_images
from embodied.errors import EmbodiedError, MissingDependencyError
from embodied.export.artifact import artifact_kind_of
from embodied.export.image_onnx import IMAGE_INPUT_KEY, export_image_onnx
from embodied.export.layers import mlp_arrays
from embodied.policies.cnn import ImageEncoder
from embodied.tasks.arm_push import ArmPush, ArmPushCfg
from embodied.tasks.arm_push_expert import ScriptedExpert

SIZE_PX = 64


def camera_env(num_envs: int, seed: int = 0, max_episode_steps: int = 100) -> ArmPush:
    """Arm-push with its ``top`` camera on; skips the test when no offscreen GL exists here."""
    cfg = ArmPushCfg()
    backend = dataclasses.replace(cfg.backend, camera="top", image_size_px=SIZE_PX, max_episode_steps=max_episode_steps)
    cfg = dataclasses.replace(cfg, backend=backend)
    try:
        return ArmPush(cfg, num_envs=num_envs, device="cpu", seed=seed)
    except MissingDependencyError as err:  # names the Debian packages (EGL or OSMesa)
        pytest.skip(str(err))


def test_image_group_shape_dtype_and_spec() -> None:
    env = camera_env(3)
    obs = env.reset(seed=0)
    assert env.obs_spec[IMAGE_GROUP] == (SIZE_PX, SIZE_PX, 3)
    assert obs[IMAGE_GROUP].shape == (3, SIZE_PX, SIZE_PX, 3) and obs[IMAGE_GROUP].dtype == torch.uint8
    assert isinstance(env, RenderingEnv) and renders_images(env)
    obs, *_, info = env.step(torch.zeros(3, 3))
    assert info["final_obs"][IMAGE_GROUP].shape == (3, SIZE_PX, SIZE_PX, 3)
    assert torch.equal(obs[IMAGE_GROUP], env.render_images())
    # the picture has content: the table, the arm, a red block and a green goal
    image = obs[IMAGE_GROUP][0].numpy().astype(int)
    assert image.std() > 10
    red = (image[..., 0] > 150) & (image[..., 1] < 100)
    green = (image[..., 1] > 150) & (image[..., 0] < 120)
    assert red.sum() >= 4 and green.sum() >= 4


def test_the_registry_says_which_backends_render() -> None:
    from embodied.registry import BACKENDS

    # the envs of these backends are RenderingEnvs; the others put no images in observations
    assert [name for name, row in BACKENDS.items() if row.renders] == ["mujoco", "maniskill", "robosuite"]


def test_no_camera_by_default() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    assert IMAGE_GROUP not in env.reset(seed=0) and IMAGE_GROUP not in env.obs_spec
    assert not renders_images(env)
    with pytest.raises(RuntimeError, match=r"env\.backend\.camera"):
        env.render_images()


def test_unknown_camera_is_named() -> None:
    cfg = ArmPushCfg()
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, camera="side"))
    with pytest.raises(ConfigError, match=r"no camera 'side'.*top"):
        ArmPush(cfg, num_envs=1, device="cpu", seed=0)


def test_images_are_deterministic() -> None:
    a, b = camera_env(4, seed=5), camera_env(4, seed=5)
    gen = torch.Generator().manual_seed(0)
    obs_a, obs_b = a.reset(seed=1), b.reset(seed=1)
    for _ in range(5):
        action = torch.rand(4, 3, generator=gen) * 2 - 1
        obs_a, *_ = a.step(action)
        obs_b, *_ = b.step(action)
        assert torch.equal(obs_a[IMAGE_GROUP], obs_b[IMAGE_GROUP])


def test_same_state_renders_the_same_image() -> None:
    env = camera_env(3)
    env.reset(seed=0)
    env.physics.state[1] = env.physics.state[0]
    env.physics.forward()
    images = env.render_images()
    assert torch.equal(images[0], images[1])
    assert not torch.equal(images[0], images[2])  # another block/goal draw looks different
    # a different env object (one simulation) with that state draws the same pixels
    other = camera_env(1)
    other.physics.state[0] = env.physics.state[0]
    other.physics.forward()
    assert torch.equal(other.render_images()[0], images[0])


def test_final_obs_images_are_taken_before_the_reset() -> None:
    env = camera_env(4, max_episode_steps=3)
    env.reset(seed=0)
    for _ in range(2):
        obs, *_ = env.step(torch.full((4, 3), 0.5))
    before = env.render_images()  # the state the next step starts from
    obs, _, _, trunc, info = env.step(torch.full((4, 3), 0.5))
    assert bool(trunc.all())
    final = info["final_obs"][IMAGE_GROUP]
    assert torch.equal(obs[IMAGE_GROUP], env.render_images())  # the reset states
    for i in range(4):
        assert not torch.equal(final[i], obs[IMAGE_GROUP][i])
        # the arm kept moving during the last step: the final image is not the one before it either
        assert not torch.equal(final[i], before[i])


def test_encoder_shapes_and_scaling() -> None:
    enc = ImageEncoder((SIZE_PX, SIZE_PX, 3), features=32)
    images = torch.randint(0, 256, (5, SIZE_PX, SIZE_PX, 3), dtype=torch.uint8)
    out = enc(images)
    assert out.shape == (5, 32)
    # uint8 pixels and the same values as floats 0..255 are one input
    assert torch.allclose(out, enc(images.float()))
    with pytest.raises(ValueError, match="too small"):
        ImageEncoder((24, 24, 3))


def test_cnn_encoder_needs_images() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    with pytest.raises(ConfigError, match=r"env\.backend\.camera"):
        PPO(PPOCfg(encoder="cnn"), env)


def _image_policy(env: ArmPush) -> PPO:
    torch.manual_seed(0)
    algo = PPO(PPOCfg(encoder="cnn", num_steps_per_env=4, num_minibatches=2), env)
    obs = env.reset(seed=0)
    algo.policy.update_normalizers(obs["policy"] * 3.0 + 1.0, None)  # a non-trivial normalizer
    return algo


def test_ppo_trains_the_encoder() -> None:
    env = camera_env(4)
    algo = _image_policy(env)
    assert algo.policy.encoder is not None
    before = [p.detach().clone() for p in algo.policy.encoder.parameters()]
    obs = fill_rollout(algo, env, env.reset(seed=0))
    algo.update()
    after = list(algo.policy.encoder.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # a deterministic action reads the image: other pixels, another action
    act = algo.policy.act(obs, deterministic=True)
    dark = {**obs, IMAGE_GROUP: torch.zeros_like(obs[IMAGE_GROUP])}
    assert not torch.allclose(act, algo.policy.act(dark, deterministic=True))


def test_onnx_export_matches_torch(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    env = camera_env(4)
    module = _image_policy(env).policy.export_module()
    obs = env.reset(seed=0)
    recorded = {"obs": obs["policy"].numpy(), "image": obs[IMAGE_GROUP].numpy()}
    report = export_image_onnx(module, env.io_spec(), tmp_path, recorded, camera="top")
    assert report.max_abs_err <= 1e-5
    session = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in session.get_inputs()}
    assert inputs["obs"].type == "tensor(float)" and inputs["image"].type == "tensor(uint8)"
    assert inputs["image"].shape[1:] == [SIZE_PX, SIZE_PX, 3]
    (got,) = session.run(["action"], {"obs": recorded["obs"], "image": recorded["image"]})
    with torch.no_grad():
        want = module(obs["policy"], obs[IMAGE_GROUP]).numpy()
    assert np.abs(got - want).max() <= 1e-5
    policy_io = json.loads((tmp_path / "policy_io.json").read_text())
    entry = policy_io[IMAGE_INPUT_KEY]
    assert entry["shape"] == ["batch", SIZE_PX, SIZE_PX, 3] and entry["dtype"] == "uint8"
    assert entry["layout"] == "NHWC" and entry["camera"] == "top"
    assert policy_io["model_sha256"] == report.model_sha256


def test_c_export_refuses_the_cnn_naming_the_layer() -> None:
    env = camera_env(2)
    module = _image_policy(env).policy.export_module()
    with pytest.raises(EmbodiedError, match=r"encoder\.convs\.0.*Conv2d\(3 -> 16, kernel 8x8, stride 4\)"):
        mlp_arrays(module)
    assert artifact_kind_of(module) == "image"  # the artifact kind describes it; the C exporter still cannot


def test_image_demos_round_trip(tmp_path: Path) -> None:
    env = camera_env(4)
    episodes = collect_episodes(env, ScriptedExpert().act, 4, seed=0, images=True)
    for ep in episodes:
        assert ep.images is not None and ep.images.shape == (len(ep.observations), SIZE_PX, SIZE_PX, 3)
    write_dataset(tmp_path / "demos", episodes, "embodied/arm-push-images-v0", "scripted")
    data = load_dataset(tmp_path / "demos", obs_dim=18, action_dim=3)
    assert data.images is not None and data.next_images is not None
    steps, first_images = len(episodes[0].actions), episodes[0].images
    assert first_images is not None
    assert np.array_equal(data.images[:steps], first_images[:-1])
    assert np.array_equal(data.next_images[:steps], first_images[1:])
    assert len(data.images) == len(data.obs)
    minari = pytest.importorskip("minari")
    loaded = minari.MinariDataset(tmp_path / "demos" / "data")
    first = next(iter(loaded.iterate_episodes()))
    assert np.array_equal(first.observations["image"], first_images)
    assert np.array_equal(first.observations["policy"], episodes[0].observations)


def test_images_need_a_camera() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    with pytest.raises(ValueError, match=r"env\.backend\.camera"):
        collect_episodes(env, ScriptedExpert().act, 1, images=True)


def _reach_env(num_envs: int, seed: int) -> ArmPush:
    """Arm-push rewarding only ``-|fingertip - block|`` per step, 40-step episodes, 48 px images."""
    cfg = ArmPushCfg(reward="dense", push_weight=0.0, reach_weight=1.0)
    cfg = dataclasses.replace(
        cfg, backend=dataclasses.replace(cfg.backend, camera="top", image_size_px=48, max_episode_steps=40)
    )
    try:
        return ArmPush(cfg, num_envs=num_envs, device="cpu", seed=seed)
    except MissingDependencyError as err:
        pytest.skip(str(err))


def _reach_return(policy: torch.nn.Module) -> float:
    """Mean deterministic 40-step return of 32 fixed episodes."""
    env = _reach_env(32, seed=123)
    obs = env.reset(seed=7)
    total = torch.zeros(32)
    for _ in range(40):
        obs, reward, *_ = env.step(policy.act(obs, deterministic=True))  # type: ignore[operator]
        total += reward
    return float(total.mean())


@pytest.mark.slow  # ~30 s on a 2-core CPU: 4096 rendered steps and CNN updates
def test_ppo_with_images_learns_to_reach() -> None:
    """PPO with the CNN encoder (image + proprioception) learns to bring the fingertip to the
    block: the return rises past a level no untrained policy of these seeds reached (untrained:
    -6.1 to -11.8 over 8 initializations; trained for 8 updates: -2.7 to -5.3)."""
    torch.manual_seed(3)
    env = _reach_env(16, seed=0)
    cfg = PPOCfg(encoder="cnn", learning_rate=1e-3, schedule="fixed", init_std=0.5, entropy_coef=0.0)
    algo = PPO(cfg, env)
    untrained = _reach_return(algo.policy)
    obs = env.reset(seed=0)
    for _ in range(8):
        obs = fill_rollout(algo, env, obs)
        algo.update()
    trained = _reach_return(algo.policy)
    assert trained > -4.5, (untrained, trained)
    assert trained > untrained + 2.0, (untrained, trained)


def test_cli_train_eval_export_collect_with_images(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from embodied.cli import main

    camera_env(1)  # skips without offscreen GL
    run_dir = tmp_path / "run"
    code = main([
        "train", "arm-push", "--algo", "ppo", "--run-dir", str(run_dir), "--no-progress", "--num-envs", "4",
        "env.backend.camera=top", "env.backend.image_size_px=40", "env.backend.max_episode_steps=8",
        "algo.encoder=cnn", "algo.num_steps_per_env=8", "algo.num_minibatches=2",
        "trainer.total_env_steps=32", "trainer.eval_episodes=4", "trainer.torch_threads=1",
    ])  # fmt: skip
    assert code == 0
    assert main(["eval", str(run_dir), "--episodes", "4", "--json"]) == 0
    assert main(["export", str(run_dir), "--format", "onnx"]) == 0
    # the exported graph flies the env like the torch policy (same episodes, same returns)
    assert main(["eval", str(run_dir), "--episodes", "4", "--json", "--policy", "onnx"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    torch_eval, onnx_eval = lines[-2], lines[-1]
    assert onnx_eval["policy"] == "onnx"
    assert abs(onnx_eval["mean_return"] - torch_eval["mean_return"]) < 1e-4
    policy_io = json.loads((run_dir / "export" / "policy_io.json").read_text())
    assert policy_io[IMAGE_INPUT_KEY]["shape"] == ["batch", 40, 40, 3] and policy_io[IMAGE_INPUT_KEY]["camera"] == "top"
    assert main(["export", str(run_dir), "--format", "c"]) == 2
    assert "Conv2d" in caplog.text
    out = tmp_path / "demos"
    assert main(["collect", str(run_dir), "--episodes", "2", "--num-envs", "2", "--images", "--out", str(out)]) == 0
    data = load_dataset(out, obs_dim=18, action_dim=3)
    assert data.images is not None and data.images.shape[1:] == (40, 40, 3)


def test_off_policy_replay_leaves_the_images_out() -> None:
    from embodied.algo import Transition
    from embodied.algos.sac import SAC, SACCfg

    env = camera_env(2)
    algo = SAC(SACCfg(buffer_size_per_env=64), env)
    assert IMAGE_GROUP not in algo.replay.obs  # the actor and critics read the policy vector only
    obs = env.reset(seed=0)
    action = algo.act(obs)
    nxt, reward, term, trunc, info = env.step(action)
    algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
    assert len(algo.replay) == 2  # one transition per env


def test_runs_saved_before_the_camera_keys_load(tmp_path: Path) -> None:
    """A config.yaml from before ``env.backend.camera`` / ``algo.encoder`` (and the same release's
    ``algo.lr_cooldown``) loads with the camera off and the MLP encoder; one that holds some of the
    release's keys but not all was cut or edited, and is refused as damaged."""
    import yaml

    from embodied.experiment import load_experiment, resolve_experiment
    from embodied.training.run import write_config

    write_config(tmp_path, resolve_experiment("arm-push", "ppo"))
    path = tmp_path / "config.yaml"
    data = yaml.safe_load(path.read_text())
    del data["env"]["backend"]["camera"], data["env"]["backend"]["image_size_px"]
    del data["algo"]["encoder"], data["algo"]["image_features"]
    path.write_text(yaml.safe_dump(data))  # still holds algo.lr_cooldown
    with pytest.raises(ConfigError, match=r"algo\.encoder"):
        load_experiment(path)
    del data["algo"]["lr_cooldown"]
    path.write_text(yaml.safe_dump(data))
    loaded = load_experiment(path)
    assert loaded.env.backend.camera == "" and loaded.algo.encoder == "mlp"
