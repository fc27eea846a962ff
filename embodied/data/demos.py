"""Demonstration datasets in Minari's on-disk format (HDF5), written and read without Minari.

Why Minari: it is Farama's gymnasium-native offline-RL format, one HDF5 file plus a JSON
metadata file, readable by ``minari`` itself (pure Python, light pins) and by anything with
``h5py``; LeRobot's format pins its own torch. Layout of a dataset directory ``PATH``::

    PATH/data/main_data.hdf5   groups episode_<i>: observations [T+1, D] float32,
                               actions [T, A] float32, rewards [T] float64,
                               terminations [T] bool, truncations [T] bool, infos (group)
    PATH/data/metadata.json    total_episodes, total_steps, spaces, dataset_id, ...

A dataset recorded with camera images (``embodied collect ... --images``) has a Dict
observation space, as Minari stores one: ``observations`` is then a group holding
``policy [T+1, D]`` float32 and ``image [T+1, H, W, 3]`` uint8 (channels last), and
``observation_space`` is ``Dict(policy: Box, image: Box(0, 255, uint8))``; images are stored
raw (lossless, gzip per frame) and ``jpeg_encoding: false`` tells Minari so.

``minari.MinariDataset(PATH / "data")`` loads it; placed at
``$MINARI_DATASETS_PATH/<namespace>/<name>`` it is also found by ``minari.load_dataset``.
Only ``h5py`` is needed here (``pip install 'embodied[data]'``); nothing is downloaded.

Shapes: ``T`` = steps of one episode, ``M`` = steps of all episodes, ``D``/``A`` =
observation/action sizes, ``H`` = action-chunk length.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.errors import EmbodiedError

DATA_FILE = Path("data") / "main_data.hdf5"
METADATA_FILE = Path("data") / "metadata.json"
MINARI_VERSION = "0.5.4"
"""The Minari release whose layout this module writes (checked by a round-trip test)."""
EPISODE_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")
IMAGE_KEY = "image"
"""Key of the camera images inside a Dict ``observations`` group (the env's observation group)."""


class DatasetError(EmbodiedError):
    """A dataset directory that is missing, truncated, corrupt, or does not fit the task."""


@dataclass
class Episode:
    """One demonstration: ``observations [T+1, D]`` (the last is the final observation),
    ``actions [T, A]`` in [-1, 1], ``rewards [T]``, ``terminations``/``truncations [T]`` bool;
    ``images [T+1, H, W, 3]`` uint8 camera images of the same steps, or None."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    images: np.ndarray | None = None


def _h5py() -> Any:
    try:
        import h5py
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("demonstration datasets need h5py: pip install 'embodied[data]'") from err
    return h5py


def _box(dim: int, low: float, high: float) -> dict[str, Any]:
    return {"type": "Box", "dtype": "float32", "shape": [dim], "low": [low] * dim, "high": [high] * dim}


def _observation_space(obs_dim: int, image_shape: tuple[int, ...] | None) -> str:
    """Minari's JSON of the observation space: a Box, or with images a Dict of two Boxes."""
    box = _box(obs_dim, -math.inf, math.inf)
    if image_shape is None:
        return json.dumps(box)
    # full nested bounds: gymnasium's Box (Minari's deserializer) rejects scalar ones for a shape
    low = np.zeros(image_shape, dtype=np.uint8)
    image = {
        "type": "Box",
        "dtype": "uint8",
        "shape": list(image_shape),
        "low": low.tolist(),
        "high": (low + 255).tolist(),
    }
    return json.dumps({"type": "Dict", "subspaces": {"policy": box, IMAGE_KEY: image}})


def write_dataset(
    path: Path, episodes: list[Episode], dataset_id: str, algorithm_name: str, description: str = ""
) -> Path:
    """Write ``episodes`` as a Minari dataset directory at ``path`` (must not exist yet)."""
    path = Path(path)
    if path.exists():
        raise DatasetError(f"{path} already exists; choose a new --out folder")
    if not episodes:
        raise DatasetError("no episodes to write")
    obs_dim = int(episodes[0].observations.shape[1])
    action_dim = int(episodes[0].actions.shape[1])
    first_images = episodes[0].images
    image_shape = None if first_images is None else tuple(int(v) for v in first_images.shape[1:])
    if any((ep.images is None) != (image_shape is None) for ep in episodes):
        raise DatasetError("either every episode carries camera images or none does")
    h5py = _h5py()
    (path / "data").mkdir(parents=True)
    with h5py.File(path / DATA_FILE, "w") as f:
        for i, ep in enumerate(episodes):
            group = f.create_group(f"episode_{i}")
            group.attrs["id"] = np.int64(i)
            group.attrs["total_steps"] = np.int64(len(ep.actions))
            if ep.images is None:
                group.create_dataset("observations", data=ep.observations.astype(np.float32))
            else:
                observations = group.create_group("observations")
                observations.create_dataset("policy", data=ep.observations.astype(np.float32))
                # one image per chunk: a reader of one step decompresses one frame
                observations.create_dataset(
                    IMAGE_KEY, data=ep.images.astype(np.uint8), chunks=(1, *ep.images.shape[1:]), compression="gzip"
                )
            group.create_dataset("actions", data=ep.actions.astype(np.float32))
            group.create_dataset("rewards", data=ep.rewards.astype(np.float64))
            group.create_dataset("terminations", data=ep.terminations.astype(bool))
            group.create_dataset("truncations", data=ep.truncations.astype(bool))
            group.create_group("infos")
    metadata = {
        "total_episodes": len(episodes),
        "total_steps": int(sum(len(ep.actions) for ep in episodes)),
        "data_format": "hdf5",
        "observation_space": _observation_space(obs_dim, image_shape),
        "action_space": json.dumps(_box(action_dim, -1.0, 1.0)),
        "dataset_id": dataset_id,
        "algorithm_name": algorithm_name,
        "description": description,
        "minari_version": MINARI_VERSION,
        # Minari 0.5 decodes image spaces as JPEG bytes unless told they are raw arrays (lossless)
        "jpeg_encoding": False,
    }
    # json writes inf as Infinity, exactly as Minari's own writer does
    (path / METADATA_FILE).write_text(json.dumps(metadata))
    return path


@dataclass
class Demonstrations:
    """All steps of a dataset, flattened: ``obs [M, D]``, ``actions [M, A]``, ``rewards [M]``,
    ``episode_index [M]`` (which episode a step belongs to), ``step_index [M]`` (its step in it),
    ``episode_success [E]`` (the episode ended by termination); for transitions (off-policy
    learners) ``next_obs [M, D]`` (each step's successor, the final observation at an episode's
    last step) and ``terminations``/``truncations [M]`` bool. A dataset with camera images
    also has ``images``/``next_images [M, H, W, 3]`` uint8 (None without)."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    episode_index: np.ndarray
    step_index: np.ndarray
    episode_success: np.ndarray
    path: Path
    next_obs: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    images: np.ndarray | None = None
    next_images: np.ndarray | None = None

    @property
    def num_episodes(self) -> int:
        return len(self.episode_success)

    def camera_images(self, image_shape: tuple[int, ...], who: str) -> np.ndarray:
        """``images`` ``[M, H, W, 3]`` uint8 for a policy that sees the camera at ``image_shape``;
        a :class:`DatasetError` naming ``who`` (the algorithm) when the dataset has none or
        another size."""
        if self.images is None:
            raise DatasetError(
                f"{who}: the policy sees camera images, but dataset {self.path} has none; "
                "record one with `embodied collect ... --images --camera NAME` (or a LeRobotDataset with the camera)"
            )
        if tuple(self.images.shape[1:]) != tuple(image_shape):
            raise DatasetError(
                f"{who}: dataset {self.path} holds {tuple(self.images.shape[1:])} images, the env "
                f"renders {tuple(image_shape)} (env.backend.image_size_px); collect and train at one size"
            )
        return self.images

    def action_chunks(self, horizon: int) -> np.ndarray:
        """``[M, H, A]``: the actions of steps ``t .. t+H-1`` of the same episode; past the
        episode's end the last action repeats (the expert would hold still)."""
        m = len(self.actions)
        idx = np.arange(m)[:, None] + np.arange(horizon)[None, :]
        idx = np.minimum(idx, m - 1)
        # clamp to the episode's last step: steps of the next episode must not leak in
        last = np.empty(m, dtype=np.int64)
        ends = np.flatnonzero(np.diff(self.episode_index, append=-1) != 0)
        starts = np.concatenate([[0], ends[:-1] + 1])
        for s, e in zip(starts, ends, strict=True):
            last[s : e + 1] = e
        idx = np.minimum(idx, last[:, None])
        return self.actions[idx]


def load_dataset(path: Path, obs_dim: int | None = None, action_dim: int | None = None) -> Demonstrations:
    """Read and validate a dataset directory; ``obs_dim``/``action_dim``: the task's sizes to check.

    A LeRobotDataset folder (it has ``meta/info.json``) is read by
    :func:`embodied.data.lerobot_format.load_lerobot_dataset` instead.
    Every failure is a :class:`DatasetError` naming the file, the episode and the key.
    """
    path = Path(path)
    from embodied.data.lerobot_format import is_lerobot_dataset, load_lerobot_dataset  # it imports this module

    if is_lerobot_dataset(path):
        return load_lerobot_dataset(path, obs_dim, action_dim)
    data_file, meta_file = path / DATA_FILE, path / METADATA_FILE
    if not path.is_dir():
        raise DatasetError(f"dataset {path} does not exist (write one with `embodied collect ... --out {path}`)")
    for needed in (data_file, meta_file):
        if not needed.is_file():
            raise DatasetError(
                f"dataset {path}: missing {needed} (a Minari dataset has data/main_data.hdf5 and data/metadata.json, "
                "a LeRobotDataset meta/info.json)"
            )
    try:
        metadata = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"{meta_file}: not valid JSON ({err})") from None
    h5py = _h5py()
    try:
        f = h5py.File(data_file, "r")
    except OSError as err:
        raise DatasetError(f"{data_file}: cannot be read as HDF5, truncated or corrupt ({err})") from None
    obs_parts: list[np.ndarray] = []
    act_parts, rew_parts, success, next_parts, term_parts, trunc_parts = [], [], [], [], [], []
    image_parts: list[np.ndarray] = []
    next_image_parts: list[np.ndarray] = []
    try:
        names = sorted((k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_")[1]))
        if not names:
            raise DatasetError(f"{data_file}: no episode_<i> groups")
        expected = metadata.get("total_episodes")
        if expected is not None and expected != len(names):
            raise DatasetError(f"{data_file}: {len(names)} episodes, but {meta_file} says total_episodes={expected}")
        for name in names:
            group = f[name]
            missing = [k for k in EPISODE_KEYS if k not in group]
            if missing:
                raise DatasetError(f"{data_file}: {name} has no {', '.join(missing)}")
            try:
                ep, images = _read_episode(group, h5py)
            except (OSError, KeyError) as err:
                raise DatasetError(f"{data_file}: {name} cannot be read, truncated or corrupt ({err})") from None
            _check_episode(ep, f"{data_file}: {name}", obs_dim, action_dim)
            if (images is not None) != bool(image_parts) and obs_parts:
                raise DatasetError(f"{data_file}: {name} differs from earlier episodes in carrying camera images")
            if images is not None:
                if images.shape[0] != len(ep["observations"]) or images.dtype != np.uint8 or images.ndim != 4:
                    raise DatasetError(
                        f"{data_file}: {name} observations/{IMAGE_KEY} must be [T+1, H, W, 3] uint8 like its "
                        f"{len(ep['observations'])} observations, got {images.shape} {images.dtype}"
                    )
                image_parts.append(images[:-1])
                next_image_parts.append(images[1:])
            obs_parts.append(ep["observations"][:-1])
            next_parts.append(ep["observations"][1:])
            term_parts.append(ep["terminations"].astype(bool))
            trunc_parts.append(ep["truncations"].astype(bool))
            act_parts.append(ep["actions"])
            rew_parts.append(ep["rewards"])
            success.append(bool(ep["terminations"].any()))
    finally:
        f.close()
    lengths = np.array([len(a) for a in act_parts])
    return Demonstrations(
        obs=np.concatenate(obs_parts).astype(np.float32),
        actions=np.concatenate(act_parts).astype(np.float32),
        rewards=np.concatenate(rew_parts),
        episode_index=np.repeat(np.arange(len(lengths)), lengths),
        step_index=np.concatenate([np.arange(n) for n in lengths]),
        episode_success=np.array(success),
        path=path,
        next_obs=np.concatenate(next_parts).astype(np.float32),
        terminations=np.concatenate(term_parts),
        truncations=np.concatenate(trunc_parts),
        images=np.concatenate(image_parts) if image_parts else None,
        next_images=np.concatenate(next_image_parts) if next_image_parts else None,
    )


def _read_episode(group: Any, h5py: Any) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """The :data:`EPISODE_KEYS` arrays of one episode group (``observations`` = the policy
    vector) and its camera images (``[T+1, H, W, 3]`` uint8, or None for a Box dataset)."""
    observations = group["observations"]
    images = None
    if isinstance(observations, h5py.Group):
        images = np.asarray(observations[IMAGE_KEY][()])
        observations = observations["policy"]
    ep = {k: np.asarray(group[k][()]) for k in EPISODE_KEYS if k != "observations"}
    ep["observations"] = np.asarray(observations[()])
    return ep, images


def _check_episode(ep: dict[str, np.ndarray], where: str, obs_dim: int | None, action_dim: int | None) -> None:
    obs, act = ep["observations"], ep["actions"]
    if obs.ndim != 2 or act.ndim != 2:
        raise DatasetError(f"{where}: observations and actions must be 2-D, got {obs.shape} and {act.shape}")
    steps = len(act)
    if steps == 0:
        raise DatasetError(f"{where}: an episode of zero steps")
    if len(obs) != steps + 1:
        raise DatasetError(f"{where}: observations has {len(obs)} rows, expected actions + 1 = {steps + 1}")
    for key in ("rewards", "terminations", "truncations"):
        if ep[key].shape != (steps,):
            raise DatasetError(f"{where}: {key} has shape {ep[key].shape}, expected ({steps},)")
    if obs_dim is not None and obs.shape[1] != obs_dim:
        raise DatasetError(f"{where}: observations are {obs.shape[1]}-dimensional, the task's are {obs_dim}")
    if action_dim is not None and act.shape[1] != action_dim:
        raise DatasetError(f"{where}: actions are {act.shape[1]}-dimensional, the task's are {action_dim}")
    if not (np.isfinite(obs).all() and np.isfinite(act).all()):
        raise DatasetError(f"{where}: observations or actions hold NaN/inf")
    if np.abs(act).max() > 1.0 + 1e-6:
        raise DatasetError(f"{where}: actions outside [-1, 1] (max |a| = {np.abs(act).max():.3g})")
