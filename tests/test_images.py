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

from embodied.algos.ppo import PPO, PPOCfg
from embodied.config import ConfigError
from embodied.data.collect import collect_episodes
from embodied.data.demos import load_dataset, write_dataset
from embodied.env import IMAGE_GROUP, RenderingEnv, renders_images
from embodied.errors import EmbodiedError, MissingDependencyError
from embodied.export.artifact import artifact_kind_known
from embodied.export.image_onnx import IMAGE_INPUT_KEY, export_image_onnx
from embodied.export.layers import mlp_arrays
from embodied.policies.cnn import ImageEncoder
from embodied.tasks.arm_push import ArmPush, ArmPushCfg
from embodied.tasks.arm_push_expert import ScriptedExpert

SIZE_PX = 64


def camera_env(num_envs: int, seed: int = 0, **backend: object) -> ArmPush:
    """Arm-push with its ``top`` camera on; skips the test when no offscreen GL exists here."""
    cfg = ArmPushCfg()
    cfg = dataclasses.replace(
        cfg, backend=dataclasses.replace(cfg.backend, camera="top", image_size_px=SIZE_PX, **backend)
    )
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


def test_no_camera_by_default() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    assert IMAGE_GROUP not in env.reset(seed=0) and IMAGE_GROUP not in env.obs_spec
    assert not renders_images(env)
    with pytest.raises(RuntimeError, match="env.backend.camera"):
        env.render_images()


def test_unknown_camera_is_named() -> None:
    cfg = ArmPushCfg()
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, camera="side"))
    with pytest.raises(ConfigError, match="no camera 'side'.*top"):
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
    obs, _, term, trunc, info = env.step(torch.full((4, 3), 0.5))
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
    with pytest.raises(ConfigError, match="env.backend.camera"):
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
    obs = env.reset(seed=0)
    from embodied.algo import Transition

    while not algo.ready_to_update():
        action = algo.act(obs)
        nxt, reward, term, trunc, info = env.step(action)
        algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
        obs = nxt
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
    assert not artifact_kind_known(module)


def test_image_demos_round_trip(tmp_path: Path) -> None:
    env = camera_env(4)
    episodes = collect_episodes(env, ScriptedExpert().act, 4, seed=0, images=True)
    for ep in episodes:
        assert ep.images is not None and ep.images.shape == (len(ep.observations), SIZE_PX, SIZE_PX, 3)
    write_dataset(tmp_path / "demos", episodes, "embodied/arm-push-images-v0", "scripted")
    data = load_dataset(tmp_path / "demos", obs_dim=18, action_dim=3)
    assert data.images is not None and data.next_images is not None
    steps = len(episodes[0].actions)
    assert np.array_equal(data.images[:steps], episodes[0].images[:-1])
    assert np.array_equal(data.next_images[:steps], episodes[0].images[1:])
    assert len(data.images) == len(data.obs)
    minari = pytest.importorskip("minari")
    loaded = minari.MinariDataset(tmp_path / "demos" / "data")
    first = next(iter(loaded.iterate_episodes()))
    assert np.array_equal(first.observations["image"], episodes[0].images)
    assert np.array_equal(first.observations["policy"], episodes[0].observations)


def test_images_need_a_camera() -> None:
    env = ArmPush(ArmPushCfg(), num_envs=2, device="cpu", seed=0)
    with pytest.raises(ValueError, match="env.backend.camera"):
        collect_episodes(env, ScriptedExpert().act, 1, images=True)
