"""Files in a run directory: written whole or not at all, with the permissions of any new file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embodied import run
from embodied.run import CHECKPOINT_FILE, atomic_file, atomic_write_bytes, load_checkpoint, save_checkpoint


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
