"""``--base lerobot:PATH`` and ``embodied eval lerobot:PATH``: real LeRobot policies (lerobot 0.4.4)
built small with random weights, saved with ``save_pretrained`` (model and processor pipelines,
normalization from a LeRobotDataset ``embodied collect`` wrote), and loaded back through
LeRobot's own loading code, the path a Hub id takes. Nothing is downloaded (``HF_HUB_OFFLINE=1``).

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``); skips elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lerobot_support import CAMERA, save_policy

from embodied import registry
from embodied.cli import main
from embodied.config import apply_overrides
from embodied.data.lerobot_format import IMAGE_PREFIX, STATE_KEY
from embodied.errors import EmbodiedError
from embodied.training.lerobot_base import LeRobotFeatureError, load_lerobot_policy
from embodied.training.run import CHECKPOINT_FILE

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None,
    reason="lerobot is not installed here; its environment comes from bash scripts/setup_lerobot.sh",
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lerobot") / "demos"
    argv = ["collect", "scripted:arm-push", "--episodes", "3", "--num-envs", "3", "--images", "--camera", "top"]
    assert main([*argv, "--format", "lerobot", "--out", str(root)]) == 0
    return root


def arm_push_env(num_envs: int = 3) -> Any:
    cfg = apply_overrides(registry.task_cfg("arm-push"), {"backend": {"camera": "top"}}, "test")
    return registry.make_env("arm-push", cfg, num_envs, "cpu", 0)


@pytest.mark.parametrize("kind", ["act", "diffusion", "smolvla"])
def test_loaded_base_acts_as_lerobot_does(kind: str, dataset: Path, tmp_path: Path) -> None:
    """The wrapped policy's actions on 6 steps equal LeRobot's own pipeline (from_pretrained,
    saved processors, select_action) fed the same observations."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    path = save_policy(kind, dataset, tmp_path / kind)
    env = arm_push_env()
    try:
        torch.manual_seed(1)
        ours = load_lerobot_policy(f"lerobot:{path}", "arm-push", env.obs_spec, env.action_dim, "top")
        assert ours.chunk_spec.exec_steps == {"act": 2, "diffusion": 4, "smolvla": 2}[kind]
        theirs = get_policy_class(kind).from_pretrained(path).eval()
        pre, post = make_pre_post_processors(theirs.config, pretrained_path=str(path))
        obs = env.reset(seed=3)
        for _ in range(6):
            torch.manual_seed(2)  # the diffusion sampler draws the same noise on both sides
            action = ours.act(obs, deterministic=True)
            torch.manual_seed(2)
            batch = {STATE_KEY: obs["policy"], CAMERA: obs["image"].permute(0, 3, 1, 2).float() / 255.0}
            batch["task"] = ["push the block to the goal"] * 3
            with torch.no_grad():
                expected = post(theirs.select_action(pre(batch))).clamp(-1.0, 1.0)
            torch.testing.assert_close(action, expected, rtol=0, atol=1e-6)
            obs = env.step(action)[0]
    finally:
        env.close()


# ACT alone in the fast suite: the parity test above already loads all three through lerobot:PATH
@pytest.mark.parametrize(
    "kind", ["act", pytest.param("diffusion", marks=pytest.mark.slow), pytest.param("smolvla", marks=pytest.mark.slow)]
)
def test_eval_runs_a_lerobot_checkpoint(
    kind: str, dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = save_policy(kind, dataset, tmp_path / kind)
    argv = ["eval", f"lerobot:{path}", "--task", "arm-push", "--camera", "top", "--episodes", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["episodes"] == 2 and out["policy"] == f"lerobot:{path}" and 0.0 <= out["success_rate"] <= 1.0
    assert out["mean_episode_length"] > 0


def test_feature_mismatch_names_feature_and_shapes(dataset: Path, tmp_path: Path) -> None:
    env = arm_push_env(1)
    try:
        small = save_policy("act", dataset, tmp_path / "small", image_px=32)
        with pytest.raises(
            LeRobotFeatureError,
            match=r"observation\.images\.top: the policy reads shape \(3, 32, 32\), the env provides \(3, 64, 64\)",
        ):
            load_lerobot_policy(f"lerobot:{small}", "arm-push", env.obs_spec, env.action_dim, "top")
        wrist = save_policy("act", dataset, tmp_path / "wrist", camera=IMAGE_PREFIX + "wrist")
        with pytest.raises(
            LeRobotFeatureError, match=r"missing observation\.images\.wrist: the policy reads shape \(3, 64, 64\)"
        ) as err:
            load_lerobot_policy(f"lerobot:{wrist}", "arm-push", env.obs_spec, env.action_dim, "top")
        assert "extra observation.images.top: the env provides shape (3, 64, 64)" in str(err.value)
        with pytest.raises(EmbodiedError, match="cannot load a policy config"):
            load_lerobot_policy(f"lerobot:{tmp_path / 'nothing'}", "arm-push", env.obs_spec, env.action_dim, "top")
    finally:
        env.close()
    assert main(["eval", f"lerobot:{small}", "--episodes", "1"]) == 2  # no --task: a named error


@pytest.fixture(scope="module")
def diffusion_one_obs(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Diffusion policy conditioned on the current observation only (``n_obs_steps=1``)."""
    return save_policy("diffusion", dataset, tmp_path_factory.mktemp("diffusion1"), overrides={"n_obs_steps": 1})


def lerobot_diffusion(path: Path) -> tuple[Any, Any, Any]:
    """LeRobot's own Diffusion policy and processors for ``path``, loaded as lerobot-eval does."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    theirs = get_policy_class("diffusion").from_pretrained(path).eval()
    pre, post = make_pre_post_processors(theirs.config, pretrained_path=str(path))
    return theirs, pre, post


def lerobot_raw_batch(obs: Any) -> dict[str, Any]:
    """LeRobot's batch of an arm-push observation, built by hand (the test's reference side)."""
    batch = {STATE_KEY: obs["policy"], CAMERA: obs["image"].permute(0, 3, 1, 2).float() / 255.0}
    batch["task"] = ["push the block to the goal"] * int(obs["policy"].shape[0])
    return batch


def test_plan_on_a_diffusion_base_is_lerobots_own_chunk(diffusion_one_obs: Path) -> None:
    """``plan`` on a Diffusion base (n_obs_steps=1) returns the chunk LeRobot's own ``select_action``
    queues for the same observation and noise seed, on consecutive steps and for a smaller batch
    (the final observations of ended episodes) in between."""
    env = arm_push_env()
    try:
        ours = load_lerobot_policy(f"lerobot:{diffusion_one_obs}", "arm-push", env.obs_spec, env.action_dim, "top")
        theirs, pre, post = lerobot_diffusion(diffusion_one_obs)
        n_action_steps = theirs.config.n_action_steps
        obs = env.reset(seed=3)
        for rows in (3, 1, 3):
            part = {group: value[:rows] for group, value in obs.items()}
            torch.manual_seed(2)  # the diffusion sampler draws the same noise on both sides
            chunk = ours.plan(part)
            theirs.reset()
            torch.manual_seed(2)
            with torch.no_grad():  # the first call samples the chunk, the others pop it from the queue
                actions = [post(theirs.select_action(pre(lerobot_raw_batch(part)))) for _ in range(n_action_steps)]
            expected = torch.stack(actions, dim=1).clamp(-1.0, 1.0)
            assert chunk.shape == (rows, n_action_steps, 3)
            torch.testing.assert_close(chunk, expected, rtol=0, atol=1e-6)
            obs = env.step(ours.plan(obs)[:, 0])[0]
    finally:
        env.close()


def test_plans_leave_a_diffusion_bases_own_queue_alone(diffusion_one_obs: Path) -> None:
    """Plans made between the wrapped policy's own ``select_action`` steps (as residual RL's
    successor labels are) do not change the actions that queue executes, nor its episode resets."""
    env = arm_push_env()
    try:
        ours = load_lerobot_policy(f"lerobot:{diffusion_one_obs}", "arm-push", env.obs_spec, env.action_dim, "top")
        theirs, pre, post = lerobot_diffusion(diffusion_one_obs)
        for episode in range(2):
            obs = env.reset(seed=episode)
            ours.reset_plan()
            theirs.reset()
            for _ in range(6):
                torch.manual_seed(2)
                action = ours.act(obs, deterministic=True)
                torch.manual_seed(2)
                with torch.no_grad():
                    expected = post(theirs.select_action(pre(lerobot_raw_batch(obs)))).clamp(-1.0, 1.0)
                torch.testing.assert_close(action, expected, rtol=0, atol=1e-6)
                obs = env.step(action)[0]
                ours.plan({group: value[:2] for group, value in obs.items()})  # another batch size, fresh noise
    finally:
        env.close()


def test_residual_refuses_a_diffusion_base_with_an_observation_history(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """n_obs_steps > 1 has no plan of one observation: the run stops at preload, naming the setting."""
    path = save_policy("diffusion", dataset, tmp_path / "diffusion2", overrides={"n_obs_steps": 2})
    argv = ["train", "arm-push", "--algo", "residual", "--base", f"lerobot:{path}", "--run-dir", str(tmp_path / "r")]
    argv += ["--num-envs", "2", "--no-progress", "env.backend.camera=top", "trainer.torch_threads=1"]
    assert main(argv) == 2
    assert "n_obs_steps=2" in caplog.text and "--policy.n_obs_steps=1" in caplog.text


# ACT in the slow suite (the minutes of a whole run); Diffusion is the base whose plan needs
# LeRobot's observation queues filled, so it stays in the fast one at the smallest budget
@pytest.mark.parametrize("kind", [pytest.param("act", marks=pytest.mark.slow), "diffusion"])
def test_residual_trains_on_a_lerobot_base(kind: str, dataset: Path, tmp_path: Path) -> None:
    """`embodied train arm-push --algo residual --base lerobot:PATH` (tiny budget), and the run rebuilds."""
    from embodied.training.run import load_run

    overrides = {"n_obs_steps": 1} if kind == "diffusion" else None
    path = save_policy(kind, dataset, tmp_path / kind, overrides=overrides)
    run = tmp_path / "residual"
    argv = ["train", "arm-push", "--algo", "residual", "--base", f"lerobot:{path}", "--run-dir", str(run)]
    argv += ["--num-envs", "2", "--no-progress", "env.backend.camera=top", "trainer.eval_episodes=2"]
    argv += ["trainer.torch_threads=1", "trainer.total_env_steps=8", "algo.batch_size=8", "algo.learning_starts=2"]
    assert main(argv) == 0
    assert (run / CHECKPOINT_FILE).is_file()
    loaded = load_run(run)  # the base is reloaded from lerobot:PATH
    obs = arm_push_env(2).reset(seed=0)
    assert np.isfinite(loaded.policy.act(obs, deterministic=True).numpy()).all()


def test_background_eval_recipe_rebuilds_a_residual_policy_on_a_lerobot_base(dataset: Path, tmp_path: Path) -> None:
    """The background evaluator's child loads a ``lerobot:`` base as the trainer does (not as a run
    directory), and the policy it rebuilds acts like the trainer's on the same weights."""
    from embodied.training.background_eval import PolicyRecipe

    path = save_policy("act", dataset, tmp_path / "act")
    cfg = apply_overrides(registry.task_cfg("arm-push"), {"backend": {"camera": "top"}}, "test")
    env = arm_push_env(2)
    algo_cfg = registry.algo_cfg("residual")
    algo = registry.make_algo("residual", algo_cfg, env)
    from embodied.algo import PreloadSource, preload_algorithm
    from embodied.training.lerobot_base import load_base_policy

    base = load_base_policy(f"lerobot:{path}", "arm-push", cfg, env, "cpu")
    preload_algorithm(algo, "residual", PreloadSource(base_run=Path(f"lerobot:{path}"), base_policy=base))
    rebuilt: Any = PolicyRecipe("arm-push", cfg, "residual", algo_cfg, f"lerobot:{path}")()
    trained: Any = algo.policy  # the residual policy: a module with act()
    rebuilt.load_state_dict(trained.state_dict())
    obs = env.reset(seed=0)
    with torch.no_grad():
        want = trained.act(obs, deterministic=True)
        got = rebuilt.act(obs, deterministic=True)
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())
