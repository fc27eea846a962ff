"""Files in a run directory: written whole or not at all (full disks included), sealed checkpoints,
metrics cut back on resume, temp files of killed writers removed, the permissions of any new file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.training import run
from embodied.training.run import (
    CHECKPOINT_FILE,
    METRICS_FILE,
    MetricsLogger,
    atomic_file,
    atomic_write_bytes,
    clean_temp_files,
    load_checkpoint,
    read_metrics,
    repair_metrics,
    save_checkpoint,
)


def test_checkpoint_gets_the_umask_mode_not_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lab's shared run folders need group-readable checkpoints; mkstemp alone gives 0600.
    monkeypatch.setattr(run, "_FILE_MODE", 0o640)
    save_checkpoint(tmp_path, {"weights": torch.arange(3.0)})
    assert (tmp_path / CHECKPOINT_FILE).stat().st_mode & 0o777 == 0o640
    assert torch.equal(load_checkpoint(tmp_path)["weights"], torch.arange(3.0))


def test_a_write_that_fails_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    atomic_write_bytes(path, b"old: 1\n")
    with pytest.raises(KeyboardInterrupt), atomic_file(path) as fh:
        fh.write(b"new: ")
        raise KeyboardInterrupt  # Ctrl-C halfway through the write
    assert path.read_bytes() == b"old: 1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_every_changed_byte_of_a_checkpoint_is_refused(tmp_path: Path) -> None:
    """torch.load alone checks no CRC: the seal must catch flips anywhere, headers included."""
    from embodied.training.run import CheckpointError

    save_checkpoint(tmp_path, {"weights": torch.arange(1000.0), "step": 7})
    path = tmp_path / CHECKPOINT_FILE
    original = path.read_bytes()
    assert torch.load(path, weights_only=True)["step"] == 7, "a sealed file stays a plain torch checkpoint"
    rng = np.random.default_rng(0)
    positions = [*rng.integers(0, len(original), 150), 0, len(original) - 1, len(original) - 90]
    for position in positions:
        damaged = bytearray(original)
        damaged[int(position)] ^= 1 << int(rng.integers(0, 8))
        path.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointError, match=r"latest\.pt"):
            load_checkpoint(tmp_path)
    for length in (0, 1, 100, len(original) // 2, len(original) - 1):
        path.write_bytes(original[:length])
        with pytest.raises(CheckpointError, match=r"latest\.pt"):
            load_checkpoint(tmp_path)
    path.write_bytes(original)
    assert load_checkpoint(tmp_path)["step"] == 7


def test_a_full_disk_never_leaves_half_a_metrics_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fault injection: the disk fills in the middle of a row's write."""
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log(64, {"a": 1.0})
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(run.os, "write", half_then_full)
    with pytest.raises(OSError, match="No space left") as err:
        logger.log(128, {"a": 2.0})
    assert err.value.filename == str(tmp_path / METRICS_FILE)
    monkeypatch.setattr(run.os, "write", real_write)
    assert (tmp_path / METRICS_FILE).read_text().endswith("}\n")
    logger.log(192, {"a": 3.0})
    logger.close()
    assert [r["env_steps"] for r in read_metrics(tmp_path)] == [64, 192]
    assert MetricsLogger(tmp_path, tensorboard=False).rows == 2


def test_resume_cuts_metrics_back_to_the_checkpoint_and_repairs_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text('{"env_steps": 64}\n{"env_steps": 64, "eval/x": 1}\n{"env_steps": 128}\n{"env_steps": 19')
    logger = MetricsLogger(tmp_path, tensorboard=False, keep_rows=2)
    assert logger.rows == 2
    logger.log(128, {"b": 1.0})
    logger.close()
    assert [r["env_steps"] for r in read_metrics(tmp_path)] == [64, 64, 128]
    # Checkpoints from before the row count was recorded: cut by env step.
    path.write_text('{"env_steps": 64}\n{"env_steps": 128}\n{"env_steps": 192}\n')
    assert repair_metrics(path, keep_up_to_env_steps=128) == 2
    assert [r["env_steps"] for r in read_metrics(tmp_path)] == [64, 128]


def test_temp_files_of_a_killed_writer_are_removed(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    left = [tmp_path / "ckpt" / ".latest.pt.abc123.tmp", tmp_path / ".config.yaml.x.tmp"]
    for path in left:
        path.write_bytes(b"")
    keep = tmp_path / "ckpt" / "latest.pt"
    keep.write_bytes(b"x")
    assert sorted(clean_temp_files(tmp_path)) == sorted(left)
    assert keep.exists() and not any(p.exists() for p in left)
