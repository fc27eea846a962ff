"""LeRobotDataset v3 round trips against LeRobot's own reader and writer (lerobot 0.4.4).

Runs in the LeRobot environment (``bash scripts/setup_lerobot.sh``; ``scripts/test.sh`` runs it
there with ``HF_HUB_OFFLINE=1``); in the core environment it skips with that reason. Nothing is
downloaded: the datasets are written here by ``embodied collect`` or by LeRobot's own
``LeRobotDataset.create``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from embodied.cli import main
from embodied.data.demos import DatasetError, Episode, load_dataset
from embodied.data.lerobot_format import (
    ACTION_KEY,
    DONE_KEY,
    IMAGE_PREFIX,
    REWARD_KEY,
    STATE_KEY,
    TRUNCATED_KEY,
    task_map,
)
from embodied.training.run import CHECKPOINT_FILE

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lerobot") is None,
    reason="lerobot is not installed here; its environment comes from bash scripts/setup_lerobot.sh",
)


def lerobot_dataset(root: Path) -> Any:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    return LeRobotDataset(repo_id=f"local/{root.name}", root=root)


def test_collect_writes_what_lerobot_reads_exactly(tmp_path: Path) -> None:
    """`embodied collect --format lerobot` on arm-push with the top camera: LeRobot's reader
    gives back every feature of every frame as recorded (Minari copy of the same run as truth)."""
    common = ["collect", "scripted:arm-push", "--episodes", "3", "--num-envs", "3", "--images", "--camera", "top"]
    common += ["--noise", "0.3", "--seed", "4"]
    assert main([*common, "--out", str(tmp_path / "minari")]) == 0
    assert main([*common, "--format", "lerobot", "--out", str(tmp_path / "lr")]) == 0
    truth = load_dataset(tmp_path / "minari")  # the same seed: the same episodes
    assert truth.images is not None
    dataset = lerobot_dataset(tmp_path / "lr")
    assert dataset.fps == 20 and dataset.meta.total_episodes == 3 and len(dataset) == len(truth.actions)
    camera = IMAGE_PREFIX + "top"
    assert dataset.meta.features[camera]["dtype"] == "image"
    for i in range(len(dataset)):
        frame = dataset[i]
        np.testing.assert_array_equal(frame[STATE_KEY].numpy(), truth.obs[i])
        np.testing.assert_array_equal(frame[ACTION_KEY].numpy(), truth.actions[i])
        assert float(frame[REWARD_KEY]) == np.float32(truth.rewards[i])
        assert bool(frame[DONE_KEY]) == truth.terminations[i] and bool(frame[TRUNCATED_KEY]) == truth.truncations[i]
        assert (
            int(frame["episode_index"]) == truth.episode_index[i] and int(frame["frame_index"]) == truth.step_index[i]
        )
        # LeRobot returns images as float [3, H, W] in [0, 1]; x255 gives back the uint8 pixels
        pixels = (frame[camera] * 255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()
        np.testing.assert_array_equal(pixels, truth.images[i])
        assert frame["task"] == task_map("arm-push").instruction
    # and embodied's own reader gives the same demonstrations as from the Minari copy
    ours = load_dataset(tmp_path / "lr", obs_dim=18, action_dim=3)
    for name in ("obs", "actions", "episode_index", "step_index", "terminations", "truncations", "images"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(truth, name), err_msg=name)
    np.testing.assert_array_equal(ours.rewards, truth.rewards.astype(np.float32))
    np.testing.assert_array_equal(ours.episode_success, truth.episode_success)


def test_what_lerobot_writes_we_read_exactly(tmp_path: Path) -> None:
    """A dataset written by LeRobot's own API (two episodes, a 96x72 camera, odd sizes, two task
    strings, no reward/done features) reads back value for value."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(0)
    features = {
        STATE_KEY: {"dtype": "float32", "shape": (5,), "names": None},
        ACTION_KEY: {"dtype": "float32", "shape": (2,), "names": None},
        IMAGE_PREFIX + "wrist": {"dtype": "image", "shape": (72, 96, 3), "names": ["height", "width", "channels"]},
    }
    root = tmp_path / "theirs"
    written = LeRobotDataset.create(repo_id="local/theirs", fps=10, features=features, root=root, use_videos=False)
    lengths = (4, 7)
    frames: list[dict[str, np.ndarray]] = []
    for length, task in zip(lengths, ("open the drawer", "close the drawer"), strict=True):
        for _ in range(length):
            frame: dict[str, np.ndarray] = {
                STATE_KEY: rng.normal(size=5).astype(np.float32),
                ACTION_KEY: rng.uniform(-1, 1, size=2).astype(np.float32),
                IMAGE_PREFIX + "wrist": rng.integers(0, 256, size=(72, 96, 3), dtype=np.uint8),
            }
            frames.append(dict(frame))
            written.add_frame({**frame, "task": task})
        written.save_episode()
    written.finalize()
    demos = load_dataset(root, obs_dim=5, action_dim=2)
    np.testing.assert_array_equal(demos.obs, np.stack([f[STATE_KEY] for f in frames]))
    np.testing.assert_array_equal(demos.actions, np.stack([f[ACTION_KEY] for f in frames]))
    assert demos.images is not None and demos.next_images is not None
    np.testing.assert_array_equal(demos.images, np.stack([f[IMAGE_PREFIX + "wrist"] for f in frames]))
    np.testing.assert_array_equal(demos.episode_index, np.repeat([0, 1], lengths))
    np.testing.assert_array_equal(demos.step_index, np.concatenate([np.arange(n) for n in lengths]))
    # no done feature: nothing terminated, each episode's last frame is a truncation
    assert not demos.terminations.any() and demos.truncations.nonzero()[0].tolist() == [3, 10]
    np.testing.assert_array_equal(demos.next_obs[:3], demos.obs[1:4])
    np.testing.assert_array_equal(demos.next_obs[3], demos.obs[3])  # no frame after an episode's last
    np.testing.assert_array_equal(demos.next_images[3], demos.images[3])
    with pytest.raises(DatasetError, match=r"observation\.state is 5-dimensional, the task's observations are 18"):
        load_dataset(root, obs_dim=18)


def test_lerobot_writer_refuses_mixed_and_existing(tmp_path: Path) -> None:
    from embodied.data.lerobot_writer import write_lerobot_dataset

    ep = Episode(
        np.zeros((3, 2), np.float32), np.zeros((2, 1), np.float32), np.zeros(2), np.zeros(2, bool), np.ones(2, bool)
    )
    with_images = Episode(
        ep.observations, ep.actions, ep.rewards, ep.terminations, ep.truncations, np.zeros((3, 4, 4, 3), np.uint8)
    )
    with pytest.raises(DatasetError, match="every episode carries camera images or none"):
        write_lerobot_dataset(tmp_path / "a", [ep, with_images], "local/a", 10, "x")
    with pytest.raises(DatasetError, match="need a camera name"):
        write_lerobot_dataset(tmp_path / "b", [with_images], "local/b", 10, "x")
    (tmp_path / "c").mkdir()
    with pytest.raises(DatasetError, match="already exists"):
        write_lerobot_dataset(tmp_path / "c", [ep], "local/c", 10, "x")


@pytest.mark.parametrize("algo", ["bc-flow", "o2o"])
def test_dataset_learners_train_on_a_lerobot_dataset(tmp_path: Path, algo: str) -> None:
    """`--dataset` takes a LeRobotDataset folder (tiny budgets: the learner reads it and trains)."""
    demos = tmp_path / "demos"
    argv = [
        "collect",
        "scripted:arm-push",
        "--episodes",
        "3",
        "--num-envs",
        "3",
        "--format",
        "lerobot",
        "--out",
        str(demos),
    ]
    assert main(argv) == 0
    run = tmp_path / algo
    tiny = ["trainer.eval_episodes=2", "trainer.torch_threads=1", "trainer.total_env_steps=4"]
    if algo == "bc-flow":
        tiny += ["algo.policy.hidden=[16,16]", "algo.policy.chunk=2", "algo.policy.denoise_steps=2"]
    else:
        tiny += ["algo.num_critics=2", "algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]", "algo.batch_size=8"]
        tiny += ["algo.cql_num_actions=2", "algo.offline_steps=2", "algo.offline_updates_per_step=1"]
        tiny += ["algo.learning_starts=2"]
    argv = ["train", "arm-push", "--algo", algo, "--dataset", str(demos), "--run-dir", str(run), "--num-envs", "2"]
    assert main([*argv, "--no-progress", *tiny]) == 0
    assert (run / CHECKPOINT_FILE).is_file()
