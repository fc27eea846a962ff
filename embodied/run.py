"""The run directory: resolved config, git state, metrics, TensorBoard, atomic checkpoints.

Layout: ``runs/<task>/<stamp>_<algo>_s<seed>/`` with ``config.yaml``, ``git.txt``,
``metrics.jsonl``, ``tb/`` (TensorBoard events), ``ckpt/latest.pt``, ``export/``, ``videos/``.
``play``, ``eval``, ``export`` and ``deploy`` take a run directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
import yaml

from embodied import registry
from embodied.config import to_plain
from embodied.errors import EmbodiedError
from embodied.experiment import ExperimentCfg, config_key, load_experiment
from embodied.io_spec import IOSpec

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = Path("ckpt") / "latest.pt"


def new_run_dir(root: Path, cfg: ExperimentCfg) -> Path:
    """Create ``root/<task>/<stamp>_<algo>_s<seed>/`` (a numeric suffix avoids collisions)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / config_key(cfg.task_name) / f"{stamp}_{cfg.algo_name}_s{cfg.seed}"
    path, n = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{n}")
        n += 1
    path.mkdir(parents=True)
    return path


def write_config(run_dir: Path, cfg: ExperimentCfg) -> None:
    """Save the fully resolved config and the git state of the code that ran."""
    text = "# Resolved configuration of this run (embodied train --resume reads it).\n"
    text += yaml.safe_dump(to_plain(cfg), sort_keys=False)
    atomic_write_bytes(run_dir / CONFIG_FILE, text.encode())
    (run_dir / "git.txt").write_text(_git_description())


def _git_description() -> str:
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "not a git checkout\n"
    return f"commit {rev}\n{'dirty' if dirty.strip() else 'clean'}\n{dirty}"


def _process_umask() -> int:
    """The umask (reading it means setting it; done once, at import, before any worker threads)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_process_umask()
"""Mode of files written here: what ``open()`` would give, not ``mkstemp``'s owner-only 0600."""


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` when the block ends without an error.

    The data goes to a temp file in the same folder, is fsynced, then renamed over ``path``:
    readers never see half a file, and after a crash ``path`` holds the old or the new content.
    On an error (Ctrl-C included) the temp file is removed and ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _FILE_MODE)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as fh:
        fh.write(data)


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Atomically write ``ckpt/latest.pt`` (see :func:`atomic_file`)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    with atomic_file(path) as fh:
        torch.save(state, fh)
    return path


def load_checkpoint(run_dir: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load ``ckpt/latest.pt`` with ``weights_only=True`` (no arbitrary code from pickles)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise EmbodiedError(
            f"{run_dir}: no checkpoint at {path} (the run was not trained long enough to save one, "
            "or this is not a run directory)"
        )
    state: dict[str, Any] = torch.load(path, map_location=map_location, weights_only=True)
    return state


class MetricsLogger:
    """Appends one JSON object per log step to ``metrics.jsonl``; mirrors scalars to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self._fh = self.path.open("a")
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, env_steps: int, metrics: dict[str, float]) -> None:
        row = {"env_steps": env_steps, "time": time.time()} | {
            k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()
        }
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, value, env_steps)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All rows of ``metrics.jsonl``. A last line that does not parse (the run is writing it,
    or died while writing it) is left out; a bad line anywhere else raises."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
    return rows


@dataclass
class LoadedRun:
    """A trained run, rebuilt from its directory: config, policy and a way to make its env."""

    run_dir: Path
    cfg: ExperimentCfg
    algo: Any
    io_spec: IOSpec
    checkpoint: dict[str, Any]

    @property
    def policy(self) -> Any:
        return self.algo.policy

    def make_env(self, num_envs: int, seed: int, device: str | torch.device = "cpu") -> Any:
        """A fresh env of the run's task and task config."""
        return registry.make_env(self.cfg.task_name, self.cfg.env, num_envs, device, seed)


def load_run(run_dir: Path, device: str | torch.device = "cpu") -> LoadedRun:
    """Rebuild a run's algorithm from ``config.yaml`` + ``ckpt/latest.pt`` on ``device``."""
    run_dir = Path(run_dir)
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise EmbodiedError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); pass the folder `embodied train` printed"
        )
    cfg = load_experiment(config_path)
    checkpoint = load_checkpoint(run_dir, map_location=device)
    # The algorithm is rebuilt for the training batch size: its state (rollout or replay
    # storage) is shaped by num_envs.
    env = registry.make_env(cfg.task_name, cfg.env, cfg.num_envs, device, cfg.seed)
    try:
        algo = registry.make_algo(cfg.algo_name, cfg.algo, env)
        algo.load_state_dict(checkpoint["algo"])
        io_spec = env.io_spec()
    finally:
        env.close()
    return LoadedRun(run_dir=run_dir, cfg=cfg, algo=algo, io_spec=io_spec, checkpoint=checkpoint)
