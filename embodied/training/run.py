"""The run directory: resolved config, git state, metrics, TensorBoard, atomic checkpoints.

Layout: ``runs/<task>/<stamp>_<algo>_s<seed>/`` with ``config.yaml``, ``git.txt``,
``metrics.jsonl``, ``tb/`` (TensorBoard events), ``ckpt/latest.pt``, ``export/``, ``videos/``
and ``.lock`` (see :mod:`embodied.training.run_lock`). ``play``, ``eval``, ``export`` and ``deploy`` take
a run directory.

Nothing here damages what is already on disk: checkpoints and the config are replaced
atomically, a metrics row is appended whole or not at all, and a checkpoint carries a SHA-256
of all its bytes (:mod:`embodied.checkpoint_seal`) that every load verifies.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import math
import os
import pickle
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
import yaml

from embodied import registry
from embodied.algo import PreloadSource, base_outside_checkpoint, preload_algorithm
from embodied.checkpoint_seal import SealError, load_error_detail, pickled_object_refusal, seal_trailer, unseal
from embodied.config import to_plain
from embodied.errors import EmbodiedError
from embodied.experiment import ALLOW_KEY, ExperimentCfg, config_key, load_experiment
from embodied.io_spec import IOSpec

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_FILE = Path("ckpt") / "latest.pt"
WORLD_KEY = "world"
"""Checkpoint entry of a run trained by several processes: ``{"size": N, "ranks": [...]}`` with
the own state (envs, rollout or replay, generators) of ranks 1..N-1; the rest of the checkpoint
is rank 0's, so everything that reads a policy reads it as from a single process."""


def checkpoint_world_size(ckpt: dict[str, Any], path: Path = CHECKPOINT_FILE) -> int:
    """How many training processes wrote ``ckpt`` (1 for a single process); a malformed
    ``world`` entry raises :class:`CheckpointError` naming ``path``."""
    from embodied.training.checkpoint_schema import check_world_entry

    return check_world_entry(ckpt, path)


def new_run_dir(root: Path, cfg: ExperimentCfg) -> Path:
    """Create ``root/<task>/<stamp>_<algo>_s<seed>/`` (a numeric suffix avoids collisions).

    Creation is the existence check (``mkdir`` without ``exist_ok``), so processes starting
    together never share a folder."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / config_key(cfg.task_name) / f"{stamp}_{cfg.algo_name}_s{cfg.seed}"
    _make_parent(base.parent)
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path = base.with_name(f"{base.name}-{n}")
            n += 1


def make_run_dir(path: Path) -> Path:
    """Create the exact run directory ``path`` (and its parents) if needed; errors name the path."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EmbodiedError(f"--run-dir {path}: exists and is not a directory")
    _make_parent(path)
    return path


def _make_parent(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise EmbodiedError(f"{path}: cannot create the run directory: a file is in the way") from None
    except OSError as err:
        raise EmbodiedError(f"{path}: cannot create the run directory: {err.strerror or err}") from None


def write_config(run_dir: Path, cfg: ExperimentCfg, allow: list[str] | None = None) -> None:
    """Save the fully resolved config and the git state of the code that ran.

    ``allow``: the keys whose range bound ``--i-know-what-im-doing`` lifted; saved so that
    ``--resume``, ``eval`` and ``play`` accept the same values."""
    text = "# Resolved configuration of this run (embodied train --resume reads it).\n"
    plain = to_plain(cfg)
    if allow:
        plain[ALLOW_KEY] = sorted(allow)
    text += yaml.safe_dump(plain, sort_keys=False)
    atomic_write_bytes(run_dir / CONFIG_FILE, text.encode())
    atomic_write_bytes(run_dir / "git.txt", _git_description().encode())


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
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        # A write to the open temp file fails without a file name: name the file being replaced.
        raise OSError(err.errno, err.strerror or str(err), str(err.filename or path)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


TEMP_GLOB = ".*.tmp"
"""Temp files of :func:`atomic_file`; one left behind means a process died while writing it."""


def clean_temp_files(run_dir: Path) -> list[Path]:
    """Delete temp files a killed writer left in ``run_dir``, ``ckpt/`` and ``export/``.

    Call only while holding the run's lock (:mod:`embodied.training.run_lock`): then no writer is live."""
    removed = []
    for folder in (Path(run_dir), Path(run_dir) / CHECKPOINT_FILE.parent, Path(run_dir) / "export"):
        if folder.is_dir():
            for tmp in folder.glob(TEMP_GLOB):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    if removed:
        log.info("removed %d temp file(s) of an interrupted write: %s", len(removed), ", ".join(map(str, removed)))
    return removed


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as fh:
        fh.write(data)


class CheckpointError(EmbodiedError):
    """``ckpt/latest.pt`` is missing, unreadable, corrupt or does not match the run's config."""


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> Path:
    """Atomically write sealed ``ckpt/latest.pt`` (see :func:`atomic_file`, :mod:`embodied.checkpoint_seal`).

    The state is serialized in memory first, so a full disk fails as a plain ``OSError`` of the
    temp file (and leaves the previous checkpoint in place), never inside torch's ZIP writer. The
    serialized bytes are written and sealed from a view of that one buffer, never copied (a
    replay buffer with camera images makes checkpoints of gigabytes)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    buffer = io.BytesIO()
    torch.save(state, buffer)
    archive = buffer.getbuffer()
    trailer = seal_trailer(archive)
    with atomic_file(path) as fh:
        fh.write(archive[:-2])
        fh.write(trailer)
    return path


_CORRUPT_ERRORS = (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError, KeyError, TypeError)
"""What ``torch.load`` raises for damaged or foreign contents."""


def load_checkpoint(run_dir: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load ``ckpt/latest.pt`` after verifying its seal, with ``weights_only=True`` (no arbitrary
    code from pickles); raise :class:`CheckpointError` naming the file otherwise."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{run_dir}: no checkpoint at {path} (the run was not trained long enough to save one, "
            "or this is not a run directory)"
        )
    try:
        data = unseal(path.read_bytes(), str(path))
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except SealError as err:
        raise CheckpointError(str(err)) from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read the checkpoint: {err.strerror or err}") from None
    except _CORRUPT_ERRORS as err:
        refusal = pickled_object_refusal(err)
        if refusal is not None:
            raise CheckpointError(f"{path}: {refusal}") from None
        raise CheckpointError(f"{path}: corrupt or not a checkpoint ({load_error_detail(err)})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a checkpoint (holds a {type(state).__name__}, expected a mapping)")
    _drop_pickled_snapshot(state, path)
    return state


def _drop_pickled_snapshot(state: dict[str, Any], path: Path) -> None:
    """Skip an evaluation in flight that an older version kept as a pickled module
    (``policy_bytes``): it is never unpickled, and a resume goes on without its result."""
    trainer = state.get("trainer")
    if not isinstance(trainer, dict):
        return
    pending = trainer.get("pending_eval")
    if isinstance(pending, dict) and "policy_bytes" in pending:
        log.warning(
            "%s: the evaluation in flight at %s env steps was saved as a pickled module by an older "
            "version; pickles are never loaded, so that evaluation is skipped",
            path,
            pending.get("env_steps"),
        )
        trainer["pending_eval"] = None


class MetricsLogger:
    """Appends one JSON object per log step to ``metrics.jsonl``; mirrors scalars to TensorBoard.

    Every row carries ``env_steps``. A row is written with one ``write`` on an append-only
    descriptor and cut back off if the write fails (a full disk), so the file only ever holds
    whole rows. ``keep_rows`` (a resume: the count its checkpoint recorded) or
    ``keep_up_to_env_steps`` first drops the rows logged after the checkpoint, which the resumed
    run logs again; a torn last line is always dropped.
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        keep_rows: int | None = None,
        keep_up_to_env_steps: int | None = None,
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.rows = 0
        """Rows in the file (whole lines), the count a checkpoint records."""
        if self.path.exists():
            self.rows = repair_metrics(self.path, keep_rows, keep_up_to_env_steps)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _FILE_MODE)
        self._tb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, env_steps: int, metrics: dict[str, float]) -> None:
        row = {"env_steps": env_steps, "time": time.time()} | {
            k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()
        }
        data = (json.dumps(row) + "\n").encode()
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)  # never leave half a row behind
            raise OSError(err.errno, err.strerror, str(self.path)) from None
        self.rows += 1
        if self._tb is not None:
            for key, value in metrics.items():
                self._tb.add_scalar(key, value, env_steps)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._tb is not None:
            with contextlib.suppress(OSError):
                self._tb.close()
            self._tb = None


def _parse_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """``(byte offset of the line's end, row)`` for each complete line of a metrics file."""
    rows: list[tuple[int, dict[str, Any]]] = []
    offset = 0
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        offset += len(line.encode()) + 1
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise EmbodiedError(f"{path}: line {number} is not a JSON row ({err.msg}); the file is corrupt") from None
        except (ValueError, RecursionError) as err:  # a number of more digits than Python converts; deep nesting
            what = " ".join(str(err).split())[:120] or "nested too deeply"
            raise EmbodiedError(f"{path}: line {number} is not a metrics row ({what}); the file is corrupt") from None
        if not isinstance(row, dict) or not isinstance(row.get("env_steps"), int):
            raise EmbodiedError(f"{path}: line {number} is not a metrics row with an integer 'env_steps'")
        rows.append((offset, row))
    return rows


MAX_METRICS_BYTES = 1 << 30
"""Largest ``metrics.jsonl`` read (1 GiB: about a million rows)."""


def _read_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_METRICS_BYTES:
        raise EmbodiedError(f"{path}: {size} bytes, larger than a metrics file is read (at most {MAX_METRICS_BYTES})")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise EmbodiedError(f"{path}: not UTF-8 text (offset {err.start}); the file is corrupt") from None


def repair_metrics(path: Path, keep_rows: int | None = None, keep_up_to_env_steps: int | None = None) -> int:
    """Cut a torn last line (a writer died mid-row) and the rows after the first ``keep_rows``
    or after ``keep_up_to_env_steps`` (a resumed run logs them again); return the rows left.
    A damaged complete line raises naming the file and line."""
    text = _read_text(path)
    size = len(text.encode())
    rows = _parse_rows(path, text)
    keep = rows[-1][0] if rows else 0
    if not text.endswith("\n") and text:
        log.warning("%s: dropped a torn last line left by an interrupted write", path)
    count = len(rows)
    if keep_rows is None and keep_up_to_env_steps is not None:
        keep_rows = next((i for i, (_, row) in enumerate(rows) if row["env_steps"] > keep_up_to_env_steps), count)
    if keep_rows is not None and keep_rows < count:
        log.info("%s: dropped %d row(s) logged after the checkpoint (they are logged again)", path, count - keep_rows)
        count = keep_rows
        keep = rows[keep_rows - 1][0] if keep_rows > 0 else 0
    # Blank lines count for nothing: cut at the end of the last kept row.
    if keep != size:
        with path.open("r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return count


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All rows of ``metrics.jsonl``. A last line without its newline (the run is writing it,
    or died while writing it) is left out; a bad line anywhere else raises naming the file."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    return [row for _, row in _parse_rows(path, _read_text(path))]


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
    """Rebuild a run's algorithm from ``config.yaml`` + ``ckpt/latest.pt`` on ``device``, for using its
    policy (eval, export, play, collect, a later run's base), not for training it further: an
    algorithm with ``merge_adapters`` (ReinFlow's LoRA on a VLA) folds its adapters into the weights."""
    run_dir = Path(run_dir)
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise EmbodiedError(
            f"{run_dir}: not a run directory (no {CONFIG_FILE}); pass the folder `embodied train` printed"
        )
    cfg = load_experiment(config_path)
    checkpoint = load_checkpoint(run_dir, map_location=device)
    path = run_dir / CHECKPOINT_FILE
    # The algorithm is rebuilt for the training batch size: its state (rollout or replay
    # storage) is shaped by num_envs (rank 0's share of them in a multi-process run).
    world_size = checkpoint_world_size(checkpoint, path)
    env = registry.make_env(cfg.task_name, cfg.env, cfg.num_envs // world_size, device, cfg.seed)
    try:
        algo = registry.make_algo(cfg.algo_name, cfg.algo, env)
        base_run = cfg.trainer.base_run
        if base_run is not None and base_outside_checkpoint(algo):
            from embodied.training.lerobot_base import load_base_policy  # it imports this module lazily

            base = load_base_policy(base_run, cfg.task_name, cfg.env, env, device)
            preload_algorithm(algo, cfg.algo_name, PreloadSource(base_run=Path(base_run), base_policy=base))
        check_policy_entries(checkpoint, algo, path, cfg.num_envs)
        load_algo_state(algo, checkpoint, run_dir)
        merge = getattr(algo, "merge_adapters", None)
        if callable(merge):
            merge()  # the policy leaves training as its plain architecture (adapters folded into weights)
        io_spec = env.io_spec()
    finally:
        env.close()
    return LoadedRun(run_dir=run_dir, cfg=cfg, algo=algo, io_spec=io_spec, checkpoint=checkpoint)


def check_policy_entries(checkpoint: dict[str, Any], algo: Any, path: Path, grid: int) -> None:
    """Check what reading a run's policy uses of ``checkpoint``: ``algo`` of the form of the
    freshly built ``algo``'s state, ``trainer`` (where present) by its counters' rules
    (:mod:`embodied.training.checkpoint_schema`)."""
    from embodied.training.checkpoint_schema import CheckpointSchemaError, check_like, check_trainer_entry

    if "algo" not in checkpoint:
        raise CheckpointSchemaError(f"{path}: entry 'algo' is missing; the file is not a checkpoint of this run")
    check_like(checkpoint["algo"], algo.state_dict(), "algo", path)
    if "trainer" in checkpoint:
        policy = getattr(algo, "policy", None)
        form = policy.state_dict() if isinstance(policy, torch.nn.Module) else None
        check_trainer_entry(checkpoint["trainer"], path, grid, form)


def load_algo_state(algo: Any, checkpoint: dict[str, Any], run_dir: Path) -> None:
    """``algo.load_state_dict(checkpoint["algo"])``; a checkpoint that does not fit the networks
    ``config.yaml`` describes (an edited ``actor_hidden``) raises :class:`CheckpointError`."""
    try:
        algo.load_state_dict(checkpoint["algo"])
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"{Path(run_dir) / CHECKPOINT_FILE} does not fit {Path(run_dir) / CONFIG_FILE} ({first}); "
            "was config.yaml edited after training?"
        ) from None
