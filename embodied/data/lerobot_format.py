"""LeRobotDataset v3 directories: detection, the feature names embodied uses, and a reader.

A LeRobotDataset (format ``codebase_version`` v3.0, LeRobot >= 0.4) is a folder ``ROOT``::

    ROOT/meta/info.json                 fps, features {name: {dtype, shape, names}}, totals
    ROOT/meta/tasks.parquet             task strings and their task_index
    ROOT/meta/episodes/chunk-*/file-*.parquet   per-episode metadata (length, tasks, offsets)
    ROOT/data/chunk-*/file-*.parquet    one row per frame: every non-video feature plus
                                        index, episode_index, frame_index, timestamp, task_index
    ROOT/videos/<key>/chunk-*/file-*.mp4  video features (several episodes per file)

This module reads the frame table with ``pyarrow`` alone (``pip install 'embodied[lerobot-data]'``
or the LeRobot environment, ``scripts/setup_lerobot.sh``), so every ``--dataset`` learner takes
such a folder beside a Minari one. Camera features stored as ``image`` (PNG bytes in the
parquet, lossless) decode with Pillow; ``video`` features decode through LeRobot's own video
decoder, which needs the LeRobot environment.

Mapping to :class:`~embodied.data.demos.Demonstrations` (embodied's names on the right):

- ``observation.state [D]`` -> ``obs`` (the env's ``policy`` group), ``action [A]`` -> ``actions``;
- ``next.reward`` -> ``rewards`` (0 when absent), ``next.done`` -> ``terminations``,
  ``next.truncated`` -> ``truncations`` (when absent: an episode's last frame that is not
  ``done`` is truncated);
- one camera ``observation.images.<name> [H, W, 3]`` -> ``images`` (a dataset with several
  cameras is refused naming them: embodied's image policies see one).

A LeRobotDataset keeps ``T`` frames per episode and no final observation, so the last step's
``next_obs`` is its own observation (it ends the episode: terminal, or a truncation whose
bootstrap target is then that state's value).

Shapes: ``M`` = frames of all episodes, ``D``/``A`` = state/action sizes, ``H, W`` = image size.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.data.demos import DatasetError, Demonstrations
from embodied.env import IMAGE_GROUP
from embodied.errors import import_optional

INFO_FILE = Path("meta") / "info.json"
CODEBASE_VERSION = "v3.0"
"""The LeRobotDataset format version this module reads and :mod:`embodied.data.lerobot_writer` writes."""
STATE_KEY = "observation.state"
ACTION_KEY = "action"
IMAGE_PREFIX = "observation.images."
REWARD_KEY = "next.reward"
DONE_KEY = "next.done"
TRUNCATED_KEY = "next.truncated"


@dataclass(frozen=True)
class LeRobotTaskMap:
    """How one task's observations map to LeRobot's feature names (one row of :data:`LEROBOT_TASKS`).

    ``instruction``: the ``task`` string (LeRobot's language instruction); ``state_group``: the
    observation group sent as ``observation.state``; ``cameras``: LeRobot camera name ->
    observation group, for ``observation.images.<name>`` (None: the env's one camera group
    ``image``, named after the camera it renders, ``env.backend.camera``).
    """

    instruction: str
    state_group: str = "policy"
    cameras: Mapping[str, str] | None = None

    def camera_groups(self, rendered_camera: str | None, obs_groups: Iterable[str]) -> dict[str, str]:
        """LeRobot camera name -> observation group for an env whose groups are ``obs_groups``."""
        if self.cameras is not None:
            return dict(self.cameras)
        if rendered_camera and IMAGE_GROUP in obs_groups:
            return {rendered_camera: IMAGE_GROUP}
        return {}


LEROBOT_TASKS: dict[str, LeRobotTaskMap] = {
    "arm-push": LeRobotTaskMap("push the block to the goal"),
}
"""Per-task feature mapping; a task not listed uses ``LeRobotTaskMap(<task name>)``."""


def task_map(task: str) -> LeRobotTaskMap:
    """The row of :data:`LEROBOT_TASKS` for ``task`` (its name as the instruction when absent)."""
    return LEROBOT_TASKS.get(task, LeRobotTaskMap(task))


INSTALL_HINT = "pip install 'embodied[lerobot-data]' (or use the LeRobot environment: bash scripts/setup_lerobot.sh)"


def is_lerobot_dataset(path: Path) -> bool:
    """True when ``path`` is a LeRobotDataset folder (it has ``meta/info.json``)."""
    return (Path(path) / INFO_FILE).is_file()


def read_info(path: Path) -> dict[str, Any]:
    """``meta/info.json`` of the dataset at ``path``, checked to be a v3 dataset with ``features``."""
    info_file = Path(path) / INFO_FILE
    try:
        info = json.loads(info_file.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"{info_file}: cannot be read as JSON ({err})") from None
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise DatasetError(
            f"{info_file}: codebase_version {version!r}; embodied reads LeRobotDataset {CODEBASE_VERSION} "
            "(convert older datasets with LeRobot's lerobot.datasets.v30.convert_dataset_v21_to_v30)"
        )
    if not isinstance(info.get("features"), dict):
        raise DatasetError(f"{info_file}: no 'features' mapping")
    return info


def _pyarrow() -> Any:
    return import_optional("pyarrow.parquet", "reading a LeRobotDataset", INSTALL_HINT)


def read_frames(path: Path) -> dict[str, list[Any]]:
    """Every column of the frame table (``data/**/*.parquet``), rows in ``index`` order."""
    pq = _pyarrow()
    files = sorted((Path(path) / "data").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"dataset {path}: no data/chunk-*/file-*.parquet files")
    columns: dict[str, list[Any]] = {}
    for file in files:
        try:
            table = pq.read_table(file)
        except Exception as err:  # pyarrow raises its own error types for truncated or corrupt files
            raise DatasetError(f"{file}: cannot be read as parquet, truncated or corrupt ({err})") from None
        for name in table.column_names:
            columns.setdefault(name, []).extend(table.column(name).to_pylist())
    if "index" not in columns:
        raise DatasetError(f"dataset {path}: the frame table has no 'index' column")
    order = np.argsort(np.asarray(columns["index"]), kind="stable")
    return {name: [values[i] for i in order] for name, values in columns.items()}


def read_tasks(path: Path) -> dict[int, str]:
    """``task_index -> task string`` from ``meta/tasks.parquet`` (LeRobot writes the strings as
    the table's pandas index)."""
    pq = _pyarrow()
    table = pq.read_table(Path(path) / "meta" / "tasks.parquet")
    strings = [n for n in table.column_names if n != "task_index"]
    if "task_index" not in table.column_names or len(strings) != 1:
        raise DatasetError(
            f"{path}/meta/tasks.parquet: expected task_index and one task column, got {table.column_names}"
        )
    indices = table.column("task_index").to_pylist()
    return dict(zip(indices, table.column(strings[0]).to_pylist(), strict=True))


def _decode_images(path: Path, key: str, feature: dict[str, Any], frames: dict[str, list[Any]]) -> np.ndarray:
    """``[M, H, W, 3]`` uint8 of camera feature ``key``."""
    if feature["dtype"] == "image":
        pil = import_optional("PIL.Image", "decoding a LeRobotDataset's images", "pip install pillow")
        images = [np.asarray(pil.open(io.BytesIO(cell["bytes"])).convert("RGB")) for cell in frames[key]]
        return np.stack(images).astype(np.uint8)
    # video: LeRobot's own decoder (PyAV or torchcodec) at each frame's timestamp
    dataset_cls = import_optional(
        "lerobot.datasets.lerobot_dataset", "decoding a LeRobotDataset's videos", "bash scripts/setup_lerobot.sh"
    ).LeRobotDataset
    dataset = dataset_cls(repo_id=f"local/{Path(path).name}", root=path)
    images = [
        np.asarray(dataset[i][key].permute(1, 2, 0).numpy() * 255.0 + 0.5).astype(np.uint8) for i in range(len(dataset))
    ]
    return np.stack(images)


def _column(frames: dict[str, list[Any]], key: str, path: Path) -> np.ndarray:
    if key not in frames:
        raise DatasetError(f"dataset {path}: no feature {key!r} (features: {sorted(frames)})")
    return np.asarray(frames[key])


def load_lerobot_dataset(path: Path, obs_dim: int | None = None, action_dim: int | None = None) -> Demonstrations:
    """Read the LeRobotDataset at ``path`` as :class:`Demonstrations` (mapping: module docstring);
    ``obs_dim``/``action_dim``: the task's sizes to check. Failures are :class:`DatasetError` s."""
    path = Path(path)
    info = read_info(path)
    features: dict[str, dict[str, Any]] = info["features"]
    frames = read_frames(path)
    obs = _column(frames, STATE_KEY, path).astype(np.float32).reshape(len(frames["index"]), -1)
    actions = _column(frames, ACTION_KEY, path).astype(np.float32).reshape(len(obs), -1)
    episode_index = _column(frames, "episode_index", path).astype(np.int64)
    step_index = _column(frames, "frame_index", path).astype(np.int64)
    if obs_dim is not None and obs.shape[1] != obs_dim:
        raise DatasetError(
            f"dataset {path}: {STATE_KEY} is {obs.shape[1]}-dimensional, the task's observations are {obs_dim}"
        )
    if action_dim is not None and actions.shape[1] != action_dim:
        raise DatasetError(
            f"dataset {path}: {ACTION_KEY} is {actions.shape[1]}-dimensional, the task's actions are {action_dim}"
        )
    if not (np.isfinite(obs).all() and np.isfinite(actions).all()):
        raise DatasetError(f"dataset {path}: {STATE_KEY} or {ACTION_KEY} hold NaN/inf")
    if np.abs(actions).max() > 1.0 + 1e-6:
        raise DatasetError(
            f"dataset {path}: actions outside [-1, 1] (max |a| = {np.abs(actions).max():.3g}); embodied's tasks act "
            "in [-1, 1], so a dataset in robot units needs rescaling first"
        )
    last = np.diff(episode_index, append=-1) != 0  # each episode's last frame
    rewards = (
        _column(frames, REWARD_KEY, path).astype(np.float64).reshape(-1) if REWARD_KEY in frames else np.zeros(len(obs))
    )
    terminations = (
        _column(frames, DONE_KEY, path).astype(bool).reshape(-1) if DONE_KEY in frames else np.zeros(len(obs), bool)
    )
    if TRUNCATED_KEY in frames:
        truncations = _column(frames, TRUNCATED_KEY, path).astype(bool).reshape(-1)
    else:
        truncations = last & ~terminations
    next_obs = np.concatenate([obs[1:], obs[-1:]])
    next_obs[last] = obs[last]
    cameras = sorted(
        k for k, f in features.items() if k.startswith(IMAGE_PREFIX) and f.get("dtype") in ("image", "video")
    )
    if len(cameras) > 1:
        raise DatasetError(
            f"dataset {path} has {len(cameras)} cameras ({', '.join(cameras)}); embodied's image policies read one"
        )
    images = next_images = None
    if cameras:
        images = _decode_images(path, cameras[0], features[cameras[0]], frames)
        next_images = np.concatenate([images[1:], images[-1:]])
        next_images[last] = images[last]
    episodes = np.unique(episode_index)
    success = np.array([bool(terminations[episode_index == e].any()) for e in episodes])
    # episodes renumbered 0..E-1 in order, as the Minari reader gives them
    dense_episode = np.searchsorted(episodes, episode_index)
    return Demonstrations(
        obs=obs,
        actions=actions,
        rewards=rewards,
        episode_index=dense_episode,
        step_index=step_index,
        episode_success=success,
        path=path,
        next_obs=next_obs,
        terminations=terminations,
        truncations=truncations,
        images=images,
        next_images=next_images,
    )
