"""Demonstration datasets: Minari's own loader reads what we write; our loader names every defect."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from embodied.data.collect import collect_episodes
from embodied.data.demos import DATA_FILE, METADATA_FILE, DatasetError, Episode, load_dataset, write_dataset
from embodied.tasks.arm_push import ArmPush, ArmPushCfg
from embodied.tasks.arm_push_expert import ScriptedExpert


@pytest.fixture(scope="module")
def episodes() -> list[Episode]:
    env = ArmPush(ArmPushCfg(), num_envs=4, device="cpu", seed=0)
    return collect_episodes(env, ScriptedExpert().act, episodes=6, noise_std=0.1, seed=0)


@pytest.fixture
def dataset(tmp_path: Path, episodes: list[Episode]) -> Path:
    return write_dataset(tmp_path / "ds", episodes, "embodied/arm-push-test-v0", "scripted")


def test_collected_episodes_are_consistent(episodes: list[Episode]) -> None:
    assert len(episodes) == 6
    for ep in episodes:
        assert ep.observations.shape == (len(ep.actions) + 1, 18)
        assert bool(ep.terminations[-1] or ep.truncations[-1])
        assert not (ep.terminations[:-1] | ep.truncations[:-1]).any()
        # the observation after each step is the next step's observation within an episode
        assert np.abs(ep.actions).max() <= 1.0


def test_round_trip_through_minari(dataset: Path, episodes: list[Episode]) -> None:
    minari = pytest.importorskip("minari")
    loaded = minari.MinariDataset(dataset / "data")
    assert loaded.total_episodes == len(episodes)
    assert loaded.total_steps == sum(len(e.actions) for e in episodes)
    for ours, theirs in zip(episodes, loaded.iterate_episodes(), strict=True):
        np.testing.assert_array_equal(theirs.observations, ours.observations)
        np.testing.assert_array_equal(theirs.actions, ours.actions)
        np.testing.assert_array_equal(theirs.rewards, ours.rewards)
        np.testing.assert_array_equal(theirs.terminations, ours.terminations)
        np.testing.assert_array_equal(theirs.truncations, ours.truncations)
    assert loaded.observation_space.shape == (18,)
    assert loaded.action_space.shape == (3,)


def test_our_loader_flattens(dataset: Path, episodes: list[Episode]) -> None:
    demos = load_dataset(dataset, obs_dim=18, action_dim=3)
    total = sum(len(e.actions) for e in episodes)
    assert demos.obs.shape == (total, 18) and demos.actions.shape == (total, 3)
    assert demos.num_episodes == 6
    np.testing.assert_array_equal(demos.obs[: len(episodes[0].actions)], episodes[0].observations[:-1])
    chunks = demos.action_chunks(4)
    assert chunks.shape == (total, 4, 3)
    first_len = len(episodes[0].actions)
    # the last step of episode 0 repeats its own action, never episode 1's
    np.testing.assert_array_equal(chunks[first_len - 1], np.repeat(episodes[0].actions[-1:], 4, axis=0))
    np.testing.assert_array_equal(chunks[0, 1], episodes[0].actions[1])


def test_shape_mismatch_names_the_task_dims(dataset: Path) -> None:
    with pytest.raises(DatasetError, match="observations are 18-dimensional, the task's are 17"):
        load_dataset(dataset, obs_dim=17)
    with pytest.raises(DatasetError, match="actions are 3-dimensional, the task's are 2"):
        load_dataset(dataset, action_dim=2)


def test_missing_key_is_named(dataset: Path) -> None:
    with h5py.File(dataset / DATA_FILE, "a") as f:
        del f["episode_2"]["rewards"]
    with pytest.raises(DatasetError, match="episode_2 has no rewards"):
        load_dataset(dataset)


def test_row_mismatch_is_named(dataset: Path) -> None:
    with h5py.File(dataset / DATA_FILE, "a") as f:
        obs = f["episode_1"]["observations"][()]
        del f["episode_1"]["observations"]
        f["episode_1"].create_dataset("observations", data=obs[:-2])
    with pytest.raises(DatasetError, match="episode_1: observations has"):
        load_dataset(dataset)


def test_truncated_file_is_named(dataset: Path) -> None:
    path = dataset / DATA_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="truncated or corrupt"):
        load_dataset(dataset)


def test_missing_files_and_bad_metadata(tmp_path: Path, dataset: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        load_dataset(tmp_path / "nowhere")
    (dataset / METADATA_FILE).write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_dataset(dataset)
    (dataset / METADATA_FILE).write_text(json.dumps({"total_episodes": 99}))
    with pytest.raises(DatasetError, match="6 episodes, but"):
        load_dataset(dataset)
    (dataset / DATA_FILE).unlink()
    with pytest.raises(DatasetError, match="missing"):
        load_dataset(dataset)


def test_refuses_to_overwrite(dataset: Path, episodes: list[Episode]) -> None:
    with pytest.raises(DatasetError, match="already exists"):
        write_dataset(dataset, episodes, "embodied/x-v0", "scripted")
