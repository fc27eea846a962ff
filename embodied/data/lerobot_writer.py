"""Write demonstrations as a LeRobotDataset v3 through LeRobot's own recording API.

``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` / ``finalize`` write the folder, so
its layout, statistics and metadata are LeRobot's by construction; this needs the LeRobot
environment (``scripts/setup_lerobot.sh``). Features written (names: :mod:`embodied.data.lerobot_format`):

- ``observation.state`` float32 ``[D]``: the env's ``policy`` group;
- ``action`` float32 ``[A]`` in [-1, 1];
- ``next.reward`` float32 ``[1]``, ``next.done`` bool ``[1]`` (the step terminated the episode),
  ``next.truncated`` bool ``[1]`` (it hit the time limit);
- with images, ``observation.images.<camera>`` ``[H, W, 3]`` uint8 stored as LeRobot's
  ``image`` dtype (PNG, lossless), so what is read back equals what was recorded;
- ``task``: the instruction string of every frame; ``fps``: ``round(1 / env.dt)``.

Each episode's ``T`` steps become ``T`` frames; the final observation (Minari's ``T+1``-th) has no
frame in LeRobot's format.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from embodied.data.demos import DatasetError, Episode
from embodied.data.lerobot_format import (
    ACTION_KEY,
    DONE_KEY,
    IMAGE_PREFIX,
    REWARD_KEY,
    STATE_KEY,
    TRUNCATED_KEY,
)
from embodied.errors import import_optional


def require_lerobot() -> Any:
    """LeRobot's ``lerobot.datasets.lerobot_dataset`` module, or a named error saying how to get it."""
    return import_optional(
        "lerobot.datasets.lerobot_dataset", "writing a LeRobotDataset", "bash scripts/setup_lerobot.sh"
    )


def lerobot_features(
    obs_dim: int, action_dim: int, camera: str | None, image_shape: tuple[int, ...] | None
) -> dict[str, Any]:
    """LeRobot's ``features`` mapping for the episodes' sizes (``camera`` None: no images)."""
    features: dict[str, Any] = {
        STATE_KEY: {"dtype": "float32", "shape": (obs_dim,), "names": None},
        ACTION_KEY: {"dtype": "float32", "shape": (action_dim,), "names": None},
        REWARD_KEY: {"dtype": "float32", "shape": (1,), "names": None},
        DONE_KEY: {"dtype": "bool", "shape": (1,), "names": None},
        TRUNCATED_KEY: {"dtype": "bool", "shape": (1,), "names": None},
    }
    if camera is not None and image_shape is not None:
        features[IMAGE_PREFIX + camera] = {
            "dtype": "image",
            "shape": tuple(image_shape),
            "names": ["height", "width", "channels"],
        }
    return features


def write_lerobot_dataset(
    path: Path,
    episodes: list[Episode],
    repo_id: str,
    fps: int,
    instruction: str,
    camera: str | None = None,
    robot_type: str | None = None,
) -> Path:
    """Write ``episodes`` as a LeRobotDataset at ``path`` (must not exist yet); ``camera``: the
    LeRobot camera name of the episodes' images (required when they carry images)."""
    path = Path(path)
    if path.exists():
        raise DatasetError(f"{path} already exists; choose a new --out folder")
    if not episodes:
        raise DatasetError("no episodes to write")
    first = episodes[0]
    if any((ep.images is None) != (first.images is None) for ep in episodes):
        raise DatasetError("either every episode carries camera images or none does")
    image_shape = None if first.images is None else tuple(int(v) for v in first.images.shape[1:])
    if image_shape is not None and not camera:
        raise DatasetError("episodes with images need a camera name for observation.images.<camera>")
    module = require_lerobot()
    import_optional("datasets", "writing a LeRobotDataset", "bash scripts/setup_lerobot.sh").disable_progress_bars()
    features = lerobot_features(int(first.observations.shape[1]), int(first.actions.shape[1]), camera, image_shape)
    dataset = module.LeRobotDataset.create(
        repo_id=repo_id, fps=fps, features=features, root=path, robot_type=robot_type, use_videos=False
    )
    try:
        for ep in episodes:
            for t in range(len(ep.actions)):
                frame: dict[str, Any] = {
                    STATE_KEY: ep.observations[t].astype(np.float32),
                    ACTION_KEY: ep.actions[t].astype(np.float32),
                    REWARD_KEY: np.array([ep.rewards[t]], dtype=np.float32),
                    DONE_KEY: np.array([ep.terminations[t]], dtype=bool),
                    TRUNCATED_KEY: np.array([ep.truncations[t]], dtype=bool),
                    "task": instruction,
                }
                if ep.images is not None:
                    frame[IMAGE_PREFIX + str(camera)] = ep.images[t].astype(np.uint8)
                dataset.add_frame(frame)
            dataset.save_episode()
    finally:
        dataset.finalize()  # writes the parquet footers: without it the files cannot be read
    return path
